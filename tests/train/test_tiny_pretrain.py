"""The pretrained tiny pipeline's build and cache, at the seconds-long QUICK settings (the real
build's quality is measured by `python -m wfm_jax.tiny_eval`, not here): a complete build is
reused, a half-written or foreign directory is rebuilt, a build killed midway leaves no
directory to load and is resumed by the next build (tests/train/test_tiny_pretrain_interrupt.py: real
signals in child processes)."""
import json
import os

import pytest

from tests._resume import persistent_compile_cache
from wfm_jax.train import pretrain as tiny_pretrain
from wfm_jax.train.pretrain import MARKER, QUICK, ensure_pretrained, is_built

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", autouse=True)
def _builds_share_compiles(tmp_path_factory):
    """The module builds the same QUICK pipeline several times (the fixture, the rebuilds): the
    later builds load the programs the first compiled, from an on-disk cache."""
    with persistent_compile_cache(tmp_path_factory.mktemp("jax_cache")):
        yield


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("pre") / "shapes_sd3")
    ensure_pretrained(path, QUICK, log=lambda m: None)
    return path


def test_complete_build_is_loadable_and_reused(built):
    from wfm_jax.families.sd3.pipeline import SD3Pipeline
    marker = json.load(open(os.path.join(built, MARKER)))
    assert marker["complete"] and marker["settings"]["sft_steps"] == QUICK.sft_steps
    assert not os.path.exists(os.path.join(built, ".work"))
    pipe = SD3Pipeline.load(built)
    assert pipe.latent_shape(1, QUICK.size, QUICK.size) == (1, 4, QUICK.size // 2, QUICK.size // 2)
    # the grammar's words are single tokens: every prompt fits the 16-token CLIP window
    assert len(pipe.tokenizers[0]("three yellow triangles on a white background")["input_ids"]) == 9
    said = []
    assert ensure_pretrained(built, QUICK, log=said.append) == built and said == []


def test_leftovers_beside_a_complete_build_are_removed(built):
    parent, name = os.path.dirname(built), os.path.basename(built)
    stale = [os.path.join(parent, f".{name}.tmp-0badc0de"), built + ".build"]
    for path in stale:  # a build killed while another finished; one killed after its rename
        os.makedirs(os.path.join(path, "transformer"))
    assert ensure_pretrained(built, QUICK, log=lambda m: None) == built
    assert not any(os.path.exists(p) for p in stale)
    assert sorted(os.listdir(parent)) == [name]  # the lock file is gone too


def test_half_written_cache_is_rebuilt_not_loaded(built, tmp_path):
    import shutil
    partial = str(tmp_path / "partial")
    shutil.copytree(built, partial)
    os.remove(os.path.join(partial, MARKER))  # as if killed before the marker
    assert not is_built(partial, QUICK)
    said = []
    ensure_pretrained(partial, QUICK, log=said.append)
    assert "rebuilding" in said[0] and is_built(partial, QUICK)
    # other settings: also rebuilt
    assert not is_built(partial, tiny_pretrain.PretrainSettings())


def test_build_killed_midway_leaves_no_dir_and_resumes(tmp_path, monkeypatch):
    import wfm_jax.worlds.shapes.vae

    real_fit = wfm_jax.worlds.shapes.vae.fit_vae

    def killed(*a, **k):
        raise KeyboardInterrupt
    monkeypatch.setattr(wfm_jax.worlds.shapes.vae, "fit_vae", killed)
    with pytest.raises(KeyboardInterrupt):
        ensure_pretrained(str(tmp_path / "dst"), QUICK, log=lambda m: None)
    # no DIR to load, no temporary: only the work dir, holding the finished dataset stage (the
    # SFT images and the VAE's)
    assert os.listdir(tmp_path) == ["dst.build"]
    assert sorted(os.listdir(tmp_path / "dst.build")) == ["build.json", "data", "vae_data"]
    monkeypatch.setattr(wfm_jax.worlds.shapes.vae, "fit_vae", real_fit)
    said = []
    ensure_pretrained(str(tmp_path / "dst"), QUICK, log=said.append)
    assert any("resuming the interrupted build" in m for m in said)
    assert not any("shapes images written" in m for m in said)  # the dataset was kept
    assert os.listdir(tmp_path) == ["dst"] and is_built(str(tmp_path / "dst"), QUICK)


def test_random_layout_build_fits_its_vae_on_the_sft_images(tmp_path, monkeypatch):
    """SFT data drawn in the random layout, one size per scene, are the VAE's drawings: the
    VAE is fitted on them, not on a second copy."""
    import dataclasses

    import wfm_jax.worlds.shapes.vae

    fitted = []

    def killed(directory, images, **k):
        fitted.append(images)
        raise KeyboardInterrupt
    monkeypatch.setattr(wfm_jax.worlds.shapes.vae, "fit_vae", killed)
    random_layout = dataclasses.replace(QUICK, layout="random", small=None)
    with pytest.raises(KeyboardInterrupt):
        ensure_pretrained(str(tmp_path / "dst"), random_layout, log=lambda m: None)
    assert sorted(os.listdir(tmp_path / "dst.build")) == ["build.json", "data"]
    assert len(fitted) == 1 and len(fitted[0]) == QUICK.dataset_count


def test_eval_scores_every_attribute_and_chance(built):
    from wfm_jax.families.sd3.pipeline import SD3Pipeline
    from wfm_jax.train.pretrain_eval import score_pipeline
    prompts = ["a red circle on a white background", "two blue squares on a black background"]
    out = score_pipeline(SD3Pipeline.load(built), prompts, per_prompt=2, steps=2, size=QUICK.size)
    assert out["n"] == 4
    for key in ("shapes_alignment", "background", "colour", "count", "shape", "chance"):
        assert 0.0 <= out[key] <= 1.0, key
    # the independent detector's accuracy (worlds/shapes/detector.py), and its chance: the two
    # prompts differ in every attribute, so a reading matches at most one of them
    for key in ("background", "colour", "shape", "count", "all"):
        assert 0.0 <= out["detected"][key] <= 1.0, key
    assert out["detected"]["chance_colour"] <= 0.5 and out["detected"]["chance_all"] <= 0.5


def test_zero_init_zeroes_only_the_modulations_and_output(tmp_path):
    import glob

    from safetensors.numpy import load_file

    from wfm_jax.families import tiny
    base = str(tmp_path / "base")
    tiny.write_pipeline(base, 0, **tiny_pretrain.base_configs(QUICK))
    path = glob.glob(os.path.join(base, "transformer", "*.safetensors"))[0]
    before = load_file(path)
    tiny_pretrain.zero_init_transformer(base)
    after = load_file(path)
    zeroed = {k for k in after if any(z in k for z in tiny_pretrain.ZERO_INIT)}
    assert {"proj_out.weight", "norm_out.linear.weight",
            "transformer_blocks.0.norm1.linear.weight"} <= zeroed
    for k, v in after.items():
        assert (not v.any()) if k in zeroed else (v == before[k]).all(), k
