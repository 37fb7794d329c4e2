"""`python -m wfm_jax.generate` on a Qwen3-VL model dir: a tiny random Qwen3-VL saved by transformers
(save_pretrained) beside the tiny processor files. The CLI's greedy answers equal transformers'
`generate` on the same weights; its prompts equal the dir's own chat template's
`apply_chat_template(..., add_generation_prompt=True)`; bad input is one line and exit status 2."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from PIL import Image

from tests.families.qwen3_vl._tiny_processor import build_tokenizer, write_processor_dir
from tests.models.qwen3_vl._oracle import EOS, IMAGE, VIDEO, tiny_config, torch_model
from wfm_jax.cli.generate import main
from wfm_jax.families.qwen3_vl import preprocess as pp
from wfm_jax.families.qwen3_vl.answer import VisionLanguageModel, load_processor

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

N_NEW = 12


@pytest.fixture(scope="module")
def vlm_dir(tmp_path_factory):
    """(dir, torch model): weights, config.json and generation_config.json from transformers."""
    d = tmp_path_factory.mktemp("vlm")
    config = tiny_config()  # the tokenizer's vocabulary: every generated id decodes to text
    config["text_config"] = {**config["text_config"], "vocab_size": len(build_tokenizer())}
    tm = torch_model(config, seed=4)
    tm.save_pretrained(str(d))
    write_processor_dir(d)
    return d, tm


@pytest.fixture(scope="module")
def image_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("img") / "odd.png"  # odd size: resized to the 32-px grid
    Image.fromarray(np.random.default_rng(7).integers(0, 256, (70, 45, 3), np.uint8)).save(path)
    return path


def _oracle(d, tm, prompts, image_path=None):
    """transformers' tokenizer + chat template and transformers' greedy generate; the pixels
    through our preprocess_image (its parity with transformers' processors is tested in
    tests/families/qwen3_vl). Returns (templated texts, generated ids)."""
    tok = transformers.AutoTokenizer.from_pretrained(str(d))
    head = [{"type": "image"}] if image_path else []
    texts = [tok.apply_chat_template([{"role": "user", "content": [*head, {"type": "text", "text": p}]}],
                                     tokenize=False, add_generation_prompt=True) for p in prompts]
    visual = {}
    expanded = texts
    if image_path:
        cfg, _ = pp.load_vision_configs(d)
        pv, grid = pp.preprocess_image(Image.open(image_path), cfg)
        n = int(np.prod(grid)) // 4
        expanded = [t.replace("<|image_pad|>", "<|image_pad|>" * n) for t in texts]
        visual = {"pixel_values": torch.tensor(np.concatenate([pv] * len(prompts))),
                  "image_grid_thw": torch.tensor([grid] * len(prompts))}
    enc = tok(expanded, padding=True, padding_side="left", return_tensors="pt")
    ids = enc["input_ids"]
    types = torch.where(ids == IMAGE, 1, torch.where(ids == VIDEO, 2, 0))
    gen = transformers.GenerationConfig.from_pretrained(str(d))
    with torch.no_grad():
        out = tm.generate(input_ids=ids, attention_mask=enc["attention_mask"], mm_token_type_ids=types,
                          max_new_tokens=N_NEW, do_sample=False, eos_token_id=gen.eos_token_id,
                          pad_token_id=gen.pad_token_id, **visual)
    return texts, out[:, ids.shape[1]:].numpy()


def _decode(d, ids):
    tok = transformers.AutoTokenizer.from_pretrained(str(d))
    out = []
    for row in ids:
        ends = np.flatnonzero(row == EOS)
        out.append(tok.decode(row[:ends[0]] if len(ends) else row, skip_special_tokens=True))
    return out


def test_saved_dir_is_what_transformers_wrote(vlm_dir):
    d, _ = vlm_dir
    assert json.loads((d / "generation_config.json").read_text())["eos_token_id"] == EOS


def test_text_only_greedy_matches_transformers(vlm_dir, tmp_path, capsys):
    d, tm = vlm_dir
    prompts = ["What is in the box?", "Hi"]  # different lengths: a left-padded batch
    _, want = _oracle(d, tm, prompts)
    out = tmp_path / "ids.npy"
    argv = ["--model", str(d), "--max-new-tokens", str(N_NEW), "--save-array", str(out)]
    for p in prompts:
        argv += ["--prompt", p]
    assert main(argv) == 0
    got = np.load(out)
    assert got.dtype == np.int32
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)
    printed = capsys.readouterr().out.splitlines()
    assert printed == [f"[{i}] {t}" for i, t in enumerate(_decode(d, want))]


def test_image_greedy_matches_transformers(vlm_dir, image_path, tmp_path, capsys):
    d, tm = vlm_dir
    _, want = _oracle(d, tm, ["Describe it."], image_path)
    out = tmp_path / "sub" / "ids.npy"  # --save-array makes the folder
    assert main(["--model", str(d), "--image", str(image_path), "--prompt", "Describe it.",
                 "--max-new-tokens", str(N_NEW), "--save-array", str(out)]) == 0
    np.testing.assert_array_equal(np.load(out), want)
    assert capsys.readouterr().out == _decode(d, want)[0] + "\n"


def test_image_batch_library_call(vlm_dir, image_path):
    """Two prompts about one image (left padded) through the library function."""
    d, tm = vlm_dir
    prompts = ["What colour dominates here?", "Count."]
    texts, want = _oracle(d, tm, prompts, image_path)
    vlm = VisionLanguageModel.load(str(d))
    got = vlm.answer(prompts, image=Image.open(image_path), max_new_tokens=N_NEW)
    np.testing.assert_array_equal(got.token_ids, want)
    assert got.prompts == texts
    assert got.texts == _decode(d, want)


def test_video_greedy_matches_transformers(vlm_dir, tmp_path):
    """A video file through the CLI; the oracle gets the same processed inputs (the processor's
    frame sampling, timestamps and pixels are checked against transformers in tests/families)."""
    import cv2

    d, tm = vlm_dir
    clip = tmp_path / "clip.mp4"
    writer = cv2.VideoWriter(str(clip), cv2.VideoWriter_fourcc(*"mp4v"), 4.0, (64, 48))
    for i in range(9):
        writer.write(np.full((48, 64, 3), 25 * i, np.uint8))
    writer.release()
    vlm = VisionLanguageModel(None, load_processor(str(d)), [EOS], 0)
    batch = vlm.inputs(["What happens?", "Why?"], video=pp.read_video(clip))
    assert batch["video_grid_thw"].shape == (2, 3)
    with torch.no_grad():
        want = tm.generate(**{k: torch.tensor(v) for k, v in batch.items()}, max_new_tokens=N_NEW,
                           do_sample=False, eos_token_id=EOS, pad_token_id=0)
    want = want[:, batch["input_ids"].shape[1]:].numpy()
    out = tmp_path / "ids.npy"
    assert main(["--model", str(d), "--video", str(clip), "--prompt", "What happens?", "--prompt", "Why?",
                 "--max-new-tokens", str(N_NEW), "--save-array", str(out)]) == 0
    np.testing.assert_array_equal(np.load(out), want)


def test_decode_stops_at_the_end_token(vlm_dir):
    d, _ = vlm_dir
    vlm = VisionLanguageModel(None, load_processor(str(d)), [EOS], 0)
    tok = vlm.processor.tokenizer
    ended = [*tok.encode("ok, a cube"), EOS, *tok.encode("junk")]
    open_ = tok.encode("no end")
    open_ += [0] * (len(ended) - len(open_))  # pad (a special token): dropped
    assert vlm.decode(np.array([ended, open_])) == ["ok, a cube", "no end"]


def test_sampling_flags_are_seeded(vlm_dir, tmp_path):
    d, _ = vlm_dir
    runs = []
    for seed in (1, 1, 2):
        out = tmp_path / f"s{len(runs)}.npy"
        assert main(["--model", str(d), "--prompt", "Tell me", "--max-new-tokens", "8", "--temperature",
                     "1.5", "--top-p", "0.95", "--top-k", "400", "--seed", str(seed),
                     "--save-array", str(out)]) == 0
        runs.append(np.load(out))
    np.testing.assert_array_equal(runs[0], runs[1])
    assert runs[0].shape != runs[2].shape or (runs[0] != runs[2]).any()


def test_prompt_formatting_is_the_dirs_template(vlm_dir, tmp_path):
    """The templated text equals the template's own rendering, and a dir with another template
    (a default system turn) formats with that one: nothing comes from defaults."""
    d, _ = vlm_dir
    want = ("<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Where?<|im_end|>\n"
            "<|im_start|>assistant\n")
    tok = transformers.AutoTokenizer.from_pretrained(str(d))
    msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Where?"}]}]
    assert tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True) == want
    vlm = VisionLanguageModel(None, load_processor(str(d)), [EOS], 0)
    assert vlm.format(["Where?"], images=1) == [want]

    other = tmp_path / "other"
    shutil.copytree(d, other)
    template = (other / "chat_template.jinja").read_text()
    (other / "chat_template.jinja").write_text(
        "{{- '<|im_start|>system\\nBe brief.<|im_end|>\\n' -}}" + template)
    custom = VisionLanguageModel(None, load_processor(str(other)), [EOS], 0)
    tok = transformers.AutoTokenizer.from_pretrained(str(other))
    got = custom.format(["Where?"], images=1)[0]
    assert got == tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert got == "<|im_start|>system\nBe brief.<|im_end|>\n" + want
    # and the expanded prompt tokens hold one image pad per merged patch of the dir's grid
    batch = custom.inputs(["Where?"], image=np.zeros((64, 96, 3), np.uint8))
    assert (batch["input_ids"] == IMAGE).sum() == np.prod(batch["image_grid_thw"][0]) // 4 == 6


def _error(capsys, argv) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith("error: ")
    return err[0]


def test_bad_input_is_one_line(vlm_dir, image_path, tmp_path, capsys):
    d, _ = vlm_dir
    base = ["--model", str(d), "--prompt", "Hi", "--max-new-tokens", "2"]
    assert "cannot read image" in _error(capsys, [*base, "--image", str(tmp_path / "missing.png")])
    bad_video = tmp_path / "clip.mp4"
    bad_video.write_text("not a video")
    assert "video" in _error(capsys, [*base, "--video", str(bad_video)])
    assert "cannot read video" in _error(capsys, [*base, "--video", str(tmp_path / "none.mp4")])
    assert "not both" in _error(capsys, [*base, "--image", str(image_path), "--video", str(bad_video)])
    assert "--steps" in _error(capsys, [*base, "--steps", "3"])
    assert "--temperature" in _error(capsys, [*base, "--top-p", "0.5"])
    assert "--max-new-tokens" in _error(capsys, [*base[:-1], "0"])

    unknown = tmp_path / "llm"
    unknown.mkdir()
    (unknown / "config.json").write_text(json.dumps({"model_type": "qwen3",
                                                     "architectures": ["Qwen3ForCausalLM"]}))
    line = _error(capsys, ["--model", str(unknown), "--prompt", "Hi"])
    assert "neither a diffusers pipeline" in line
    assert "'qwen3'" in line
    missing = ["--model", str(tmp_path / "nope"), "--prompt", "x"]
    assert "no such pipeline directory" in _error(capsys, missing)

    text_only = tmp_path / "text_only"  # a Qwen3-VL dir without image processor settings
    shutil.copytree(d, text_only)
    for name in ("preprocessor_config.json", "video_preprocessor_config.json"):
        (text_only / name).unlink()
    line = _error(capsys, ["--model", str(text_only), "--prompt", "Hi", "--image", str(image_path)])
    assert "text only" in line

    pipeline = tmp_path / "pipe"  # a diffusion pipeline takes no --image
    pipeline.mkdir()
    (pipeline / "model_index.json").write_text(json.dumps({"_class_name": "StableDiffusion3Pipeline"}))
    assert "diffusion pipeline" in _error(capsys, ["--model", str(pipeline), "--prompt", "a cat",
                                                   "--image", str(image_path)])
