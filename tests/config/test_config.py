"""Config loading, overrides, locking, validation and the resolved config.json."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests._support.paths import REPO_ROOT
from wfm_jax.config import recipe as cfg
from wfm_jax.config.recipe import ConfigError
from wfm_jax.config.schema import DEFAULTS, default_config

REPO = REPO_ROOT


def write_recipe(tmp_path, body, name="recipe.py"):
    path = tmp_path / name
    path.write_text(textwrap.dedent("""\
        from wfm_jax.config.schema import default_config
        def get_config():
            config = default_config()
        """) + textwrap.indent(textwrap.dedent(body), "    ") + "    return config\n")
    return str(path)


def test_recipe_values_and_overrides(tmp_path):
    path = write_recipe(tmp_path, """\
        config.train.max_steps = 7
        config.policy.diffusers.inference_size = (64, 32)
        """)
    config = cfg.load_config(path, [
        ("train.optm_lr", "1e-3"), ("train.seed", "3"), ("train.resume", "True"),
        ("train.optm_betas", "(0.8, 0.9)"), ("policy.lora.target_modules", "attn.to_q,attn.to_k"),
        ("train.output_dir", "/tmp/x y"), ("train.ema_decay", "1"),
        ("train.train_policy.remote_reward.reward_fns", "[{'name': 'ocr', 'weight': 2.0}]"),
        ("distributed.num_processes", "2"), ("train.wandb.name", "None"),
    ])
    assert config.distributed.num_processes == 2 and config.distributed.process_id is None
    assert config.train.wandb.name == "None"  # a str key keeps the text
    assert config.train.max_steps == 7
    assert config.policy.diffusers.inference_size == (64, 32)
    assert config.train.optm_lr == 1e-3 and isinstance(config.train.optm_lr, float)
    assert config.train.seed == 3 and config.train.resume is True
    assert config.train.optm_betas == (0.8, 0.9)
    assert config.policy.lora.target_modules == ("attn.to_q", "attn.to_k")
    assert config.train.output_dir == "/tmp/x y"
    assert config.train.ema_decay == 1.0 and isinstance(config.train.ema_decay, float)
    assert config.train.train_policy.remote_reward.reward_fns == [{"name": "ocr", "weight": 2.0}]
    assert config.is_locked
    # untouched keys keep the schema defaults
    assert config.train.optm_weight_decay == DEFAULTS["train"]["optm_weight_decay"]


@pytest.mark.parametrize("text,expected", [("true", True), ("False", False), ("1", True), ("no", False)])
def test_bool_parsing(tmp_path, text, expected):
    config = cfg.load_config(write_recipe(tmp_path, ""), [("train.ema_enable", text)])
    assert config.train.ema_enable is expected


def test_override_typo_names_nearest_key(tmp_path):
    path = write_recipe(tmp_path, "")
    with pytest.raises(ConfigError) as err:
        cfg.load_config(path, [("train.train_policy.timestep_fraction", "0.9")])
    msg = str(err.value)
    assert "'train.train_policy.timestep_fraction'" in msg
    assert "did you mean 'timesteps_fraction'" in msg
    assert "\n" not in msg
    with pytest.raises(ConfigError, match="unknown key 'trian'; did you mean 'train'"):
        cfg.load_config(path, [("trian.seed", "1")])
    # a key that lives in another section: the full path is suggested
    with pytest.raises(ConfigError, match="did you mean 'rollout.n_generation'"):
        cfg.load_config(path, [("train.n_generation", "4")])


def test_recipe_typo_names_nearest_key(tmp_path):
    path = write_recipe(tmp_path, "config.train.train_policy.timestep_fraction = 0.99\n")
    with pytest.raises(ConfigError) as err:
        cfg.load_config(path)
    assert "unknown key 'train.train_policy.timestep_fraction'; did you mean 'timesteps_fraction'?" in str(err.value)
    assert str(err.value).startswith("recipe.py:4: ")  # the recipe line that has the typo
    path = write_recipe(tmp_path, "config.polcy.lora.r = 4\n", name="r2.py")
    with pytest.raises(ConfigError, match="unknown key 'polcy'; did you mean 'policy'"):
        cfg.load_config(path)
    # a typo made in a helper / base recipe on a sub-tree still gets its full dotted path
    (tmp_path / "child.py").write_text(textwrap.dedent("""\
        from wfm_jax.config.schema import default_config
        def tweak(train):
            train.train_policy.timestep_fraction = 0.9
        def get_config():
            config = default_config()
            tweak(config.train)
            return config
        """))
    with pytest.raises(ConfigError, match=r"^child.py:3: unknown key 'train.train_policy.timestep_fraction'; "
                                          r"did you mean 'timesteps_fraction'\?$"):
        cfg.load_config(str(tmp_path / "child.py"))


def test_type_mismatch_names_key_and_type(tmp_path):
    path = write_recipe(tmp_path, "")
    with pytest.raises(ConfigError, match=r"'train.max_steps' expects int, got '1.5'"):
        cfg.load_config(path, [("train.max_steps", "1.5")])
    with pytest.raises(ConfigError, match=r"'train.ema_enable' expects bool"):
        cfg.load_config(path, [("train.ema_enable", "maybe")])
    with pytest.raises(ConfigError, match=r"'train.optm_betas' expects float"):
        cfg.load_config(path, [("train.optm_betas", "(0.9, 'a')")])
    with pytest.raises(ConfigError, match=r"'distributed.process_id' expects int, got 'x'"):
        cfg.load_config(path, [("distributed.process_id", "x")])  # typed placeholder
    with pytest.raises(ConfigError, match=r"'train.log_freq' must be set"):
        cfg.load_config(path, [("train.log_freq", "None")])
    with pytest.raises(ConfigError, match=r"'train.epoch' must be > 0, got 0"):
        cfg.load_config(path, [("train.epoch", "0")])
    assert cfg.load_config(path, [("train.max_steps", "None")]).train.max_steps is None  # from the data
    with pytest.raises(ConfigError, match=r"'train' is a section"):
        cfg.load_config(path, [("train", "3")])
    bad = write_recipe(tmp_path, "config.train.max_steps = 'five'\n", name="r3.py")
    with pytest.raises(ConfigError, match=r"'train.max_steps' expects int, got 'five'"):
        cfg.load_config(bad)


def test_partial_dict_recipe_is_merged_and_checked(tmp_path):
    path = tmp_path / "plain.py"
    path.write_text("def get_config():\n    return {'train': {'max_steps': 3, 'sed': 1}}\n")
    with pytest.raises(ConfigError, match="unknown key 'train.sed'; did you mean 'seed'"):
        cfg.load_config(str(path))
    path.write_text("def get_config(arg):\n    return {'train': {'max_steps': int(arg)}}\n")
    assert cfg.load_config(f"{path}:11").train.max_steps == 11


def test_validation_checks(tmp_path):
    path = write_recipe(tmp_path, "")
    with pytest.raises(ConfigError, match="'train.lr_schedule' = 'cosin'.*did you mean 'cosine'"):
        cfg.load_config(path, [("train.lr_schedule", "cosin")])
    with pytest.raises(ConfigError, match="train_batch_per_replica=10 is not a multiple of "
                                          "rollout.n_generation=4"):
        cfg.load_config(path, [("train.train_policy.type", "nft"), ("rollout.n_generation", "4"),
                               ("train.train_batch_per_replica", "10")])
    with pytest.raises(ConfigError, match="'train.ema_update_step_interval' must be >= 0"):
        cfg.load_config(path, [("train.ema_update_step_interval", "-1")])
    with pytest.raises(ConfigError, match=r"'policy.vlm.vqa_fixed_think_fraction' must be in \[0, 1\], got 1.5"):
        cfg.load_config(path, [("policy.vlm.vqa_fixed_think_fraction", "1.5")])
    with pytest.raises(ConfigError, match=r"reward_fns\[0\].wieght'; did you mean 'weight'"):
        cfg.load_config(path, [("train.train_policy.remote_reward.reward_fns", "[{'name': 'a', 'wieght': 1}]")])
    with pytest.raises(ConfigError, match=r"reward_fns\[0\].nmae'; did you mean 'name'"):  # the name itself
        cfg.load_config(path, [("train.train_policy.remote_reward.reward_fns", "[{'nmae': 'a'}]")])
    # EMA interval 0 is legal (means off)
    assert cfg.load_config(path, [("train.ema_update_step_interval", "0")]).train.ema_update_step_interval == 0


def test_parallelism_takes_minus_one_on_any_one_axis(tmp_path):
    from wfm_jax.config.checks import MESH_AXES
    from wfm_jax.core.mesh import MESH_AXES as mesh_axes
    assert mesh_axes == MESH_AXES
    path = write_recipe(tmp_path, "")
    for axis in ("fsdp", "context"):
        p = cfg.load_config(path, [("policy.parallelism.data", "2"),
                                   (f"policy.parallelism.{axis}", "-1")]).policy.parallelism
        assert p[axis] == -1 and p.data == 2
    with pytest.raises(ConfigError) as err:  # the default data=-1 plus fsdp=-1
        cfg.load_config(path, [("policy.parallelism.fsdp", "-1")])
    msg = str(err.value)
    assert "\n" not in msg and "'policy.parallelism.data' and 'policy.parallelism.fsdp'" in msg
    assert "only one mesh axis" in msg and "--config.policy.parallelism.data=1" in msg
    for axis, value in (("context", "0"), ("fsdp", "-2"), ("data", "0")):
        with pytest.raises(ConfigError, match=f"'policy.parallelism.{axis}' must be > 0 or -1"):
            cfg.load_config(path, [(f"policy.parallelism.{axis}", value)])


def test_register_check_hook(tmp_path):
    calls = []

    @cfg.register_check
    def _check(config):
        calls.append(config.train.seed)
        if config.train.seed == 13:
            raise ConfigError("seed 13 is unlucky")

    try:
        with pytest.raises(ConfigError, match="unlucky"):
            cfg.load_config(write_recipe(tmp_path, ""), [("train.seed", "13")])
        assert calls == [13]
    finally:
        cfg._CHECKS.remove(_check)


def test_missing_recipe_file():
    with pytest.raises(ConfigError, match="config file not found: /nonexistent/x.py"):
        cfg.load_config("/nonexistent/x.py")


def test_save_resolved_round_trip(tmp_path):
    config = cfg.load_config(write_recipe(tmp_path, "config.train.max_steps = 9\n"),
                             [("train.optm_betas", "0.5,0.6")])
    out = tmp_path / "run" / "config.json"
    cfg.save_resolved(config, str(out))
    assert json.loads(out.read_text())["train"]["max_steps"] == 9
    assert [p for p in os.listdir(out.parent) if p != "config.json"] == []  # no temp file left
    again = cfg.load_resolved(str(out))
    assert cfg.to_plain(again) == cfg.to_plain(config)
    assert again.train.optm_betas == (0.5, 0.6)
    tree = json.loads(out.read_text())
    tree["train"]["max_stpes"] = 1
    out.write_text(json.dumps(tree))
    with pytest.raises(ConfigError, match="did you mean 'max_steps'"):
        cfg.load_resolved(str(out))


def test_default_tree_is_locked_and_independent():
    a, b = default_config(), default_config()
    a.train.max_steps = 1
    assert b.train.max_steps == DEFAULTS["train"]["max_steps"]
    with pytest.raises(AttributeError):
        a.train.new_key = 1
    cfg.validate(default_config())


def test_parse_overrides_and_cli(tmp_path):
    path, overrides = cfg.parse_overrides(["--config", "c.py", "--config.a.b=1", "--config.c", "x=y"])
    assert path == "c.py" and overrides == [("a.b", "1"), ("c", "x=y")]
    with pytest.raises(ConfigError, match="unexpected argument '--cfg.a=1'"):
        cfg.parse_overrides(["--cfg.a=1"])
    recipe = write_recipe(tmp_path, "")
    proc = subprocess.run([sys.executable, "-m", "wfm_jax.config", f"--config={recipe}",
                           "--config.train.train_policy.timestep_fraction=0.5"],
                          capture_output=True, text=True, cwd=REPO)
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines()[-1] == (
        "error: unknown key 'train.train_policy.timestep_fraction'; did you mean 'timesteps_fraction'?")


def test_flag_without_value_does_not_swallow_the_next_flag():
    # `--config.train.output_dir --config.train.output_dir=/tmp/x` once trained into a directory
    # literally named after the second flag
    with pytest.raises(ConfigError, match="'--config.train.output_dir' needs a value"):
        cfg.parse_overrides(["--config.train.output_dir", "--config.train.output_dir=/tmp/x"])
    with pytest.raises(ConfigError, match="'--config' needs a value"):
        cfg.parse_overrides(["--config", "--config.train.max_steps=3"])
    with pytest.raises(ConfigError, match="'--config.train.max_steps' needs a value"):
        cfg.parse_overrides(["--config=c.py", "--config.train.max_steps"])
    # a separate value that merely starts with one dash is still a value
    assert cfg.parse_overrides(["--config.a", "-1"]) == (None, [("a", "-1")])


def test_main_help_lists_recipes():
    proc = subprocess.run([sys.executable, "-m", "wfm_jax.main", "--help"],
                          capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: python -m wfm_jax.main --config=")
    recipes = sorted(n for n in os.listdir(os.path.join(REPO, "configs")) if n.endswith(".py"))
    listed = [line.split()[0] for line in proc.stdout.split("recipes:\n")[1].splitlines()]
    assert listed == [f"configs/{n}" for n in recipes]
    assert "Traceback" not in proc.stderr
    bare = subprocess.run([sys.executable, "-m", "wfm_jax.main"], capture_output=True, text=True,
                          cwd=REPO)
    assert bare.returncode == 2 and bare.stderr.startswith("usage:")


def test_resolved_config_masks_the_reward_token(tmp_path):
    config = cfg.load_config(write_recipe(tmp_path, ""), [
        ("train.train_policy.remote_reward.token", "s3cr3t-token"),
        ("train.train_policy.remote_reward.enqueue_url", "http://127.0.0.1:1/api/reward/enqueue")])
    out = tmp_path / "config.json"
    cfg.save_resolved(config, str(out))
    text = out.read_text()
    assert "s3cr3t-token" not in text
    remote = json.loads(text)["train"]["train_policy"]["remote_reward"]
    assert remote["token"] == cfg.REDACTED
    assert remote["enqueue_url"] == "http://127.0.0.1:1/api/reward/enqueue"  # not a secret
    assert config.train.train_policy.remote_reward.token == "s3cr3t-token"  # the run keeps it
    cfg.save_resolved(default_config(), str(out))  # an empty token stays empty
    assert json.loads(out.read_text())["train"]["train_policy"]["remote_reward"]["token"] == ""


def test_tiny_recipes_build_only_at_their_own_paths():
    # a mistyped --config.policy.model_name_or_path once got a random model built and trained
    recipe = os.path.join(REPO, "configs", "tiny_sft.py")
    own = cfg.load_config(recipe)
    assert own.policy.build_tiny and own.train.train_policy.dataset.build_tiny
    typo = cfg.load_config(recipe, [("policy.model_name_or_path", "/tmp/tiny_sd33")])
    assert not typo.policy.build_tiny
    assert typo.train.train_policy.dataset.build_tiny  # its path was not overridden
    data = cfg.load_config(recipe, [("train.train_policy.dataset.local_dir", "/tmp/shapez")])
    assert data.policy.build_tiny and not data.train.train_policy.dataset.build_tiny
    asked = cfg.load_config(recipe, [("policy.model_name_or_path", "/tmp/elsewhere"),
                                     ("policy.build_tiny", "True")])
    assert asked.policy.build_tiny  # building elsewhere on purpose


def test_nft_solvers_are_the_deterministic_ones_and_ddim_is_the_euler_step():
    """cosmos-rl's NFT recipes name "flow", "ddim", "dpm1" or "dpm2"; a stochastic sampler
    (which would need a key the NFT rollout does not draw) is one config line, not a trace error."""
    from wfm_jax.algorithms.nft.algorithm import NFT
    recipe = os.path.join(REPO_ROOT, "configs", "sd35_nft.py")
    for solver, runs in (("ddim", "euler"), ("flow", "euler"), ("dpm1", "euler"), ("dpm2", "dpm2")):
        config = cfg.load_config(recipe, [("policy.diffusers.sample.solver", solver)])
        assert NFT.from_recipe(config, 3.0).solver == runs, solver
    for solver in ("sde", "cps", "dance", "edm"):
        with pytest.raises(ConfigError, match="DiffusionNFT rolls out with a deterministic"):
            cfg.load_config(recipe, [("policy.diffusers.sample.solver", solver)])
