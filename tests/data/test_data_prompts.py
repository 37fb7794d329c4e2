"""RL prompt files (.txt / geneval .jsonl), directory resolution and train/validation splits."""
import json

import pytest

from wfm_jax.config.schema import default_config
from wfm_jax.data import DataError, prompt_splits, prompt_splits_from_config, read_prompt_file
from wfm_jax.data.prompts import holdout_split


def test_txt_skips_blank_lines(tmp_path):
    path = tmp_path / "train.txt"
    path.write_text('a cat\n\n   \n  a "STOP" sign  \nlast line')
    records = read_prompt_file(str(path))
    assert [r.prompt for r in records] == ["a cat", 'a "STOP" sign', "last line"]
    assert all(r.metadata == {} for r in records)


def test_jsonl_carries_metadata(tmp_path):
    rows = [{"tag": "counting", "include": [{"class": "cat", "count": 2}], "prompt": "two cats"},
            {"tag": "colors", "include": [{"class": "dog", "count": 1, "color": "red"}],
             "exclude": [{"class": "cat", "count": 1}], "prompt": "a red dog"}]
    path = tmp_path / "train_metadata.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    records = read_prompt_file(str(path))
    assert [r.prompt for r in records] == ["two cats", "a red dog"]
    assert [r.metadata for r in records] == rows


@pytest.mark.parametrize("content", ["", "\n  \n\n"])
def test_empty_file_is_named(tmp_path, content):
    path = tmp_path / "empty.txt"
    path.write_text(content)
    with pytest.raises(DataError, match=r"prompt file .*empty\.txt is empty"):
        read_prompt_file(str(path))


def test_unreadable_and_bad_files_are_named(tmp_path):
    binary = tmp_path / "latin.txt"
    binary.write_bytes(b"caf\xe9 \xff\xfe\n")
    with pytest.raises(DataError, match=r"cannot read prompt file .*latin\.txt"):
        read_prompt_file(str(binary))
    with pytest.raises(DataError, match=r"prompt file not found: .*nope\.txt"):
        read_prompt_file(str(tmp_path / "nope.txt"))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{"tag": "x"}\n')
    with pytest.raises(DataError, match=r'bad\.jsonl:2: expected a JSON object with a "prompt"'):
        read_prompt_file(str(bad))
    bad.write_text('{"prompt": "ok"}\n{oops\n')
    with pytest.raises(DataError, match=r"bad\.jsonl:2: not valid JSON"):
        read_prompt_file(str(bad))
    other = tmp_path / "p.csv"
    other.write_text("a\n")
    with pytest.raises(DataError, match=r"unsupported prompt file .*p\.csv"):
        read_prompt_file(str(other))


def test_directory_splits(tmp_path):
    (tmp_path / "train.txt").write_text("t1\nt2\nt3\n")
    (tmp_path / "test.txt").write_text("v1\n")
    train, val = prompt_splits(str(tmp_path))
    assert [r.prompt for r in train] == ["t1", "t2", "t3"] and [r.prompt for r in val] == ["v1"]
    other = tmp_path / "val.txt"
    other.write_text("w1\nw2\n")
    assert [r.prompt for r in prompt_splits(str(tmp_path), str(other))[1]] == ["w1", "w2"]
    empty_dir = tmp_path / "none"
    empty_dir.mkdir()
    with pytest.raises(DataError, match="no train.txt .* in prompt dataset dir .*none"):
        prompt_splits(str(empty_dir))
    with pytest.raises(DataError, match="prompt dataset not found: '.*missing'"):
        prompt_splits(str(tmp_path / "missing"))


def test_holdout_is_deterministic_and_disjoint(tmp_path):
    path = tmp_path / "p.txt"
    path.write_text("\n".join(f"p{i}" for i in range(20)))
    train, val = prompt_splits(str(path), holdout_fraction=0.25, seed=1)
    again = prompt_splits(str(path), holdout_fraction=0.25, seed=1)
    assert (train, val) == again
    assert len(val) == 5 and len(train) == 15
    assert {r.prompt for r in train} | {r.prompt for r in val} == {f"p{i}" for i in range(20)}
    assert not {r.prompt for r in train} & {r.prompt for r in val}
    assert prompt_splits(str(path), holdout_fraction=0.25, seed=2)[1] != val
    with pytest.raises(DataError, match="leaves none to train on"):
        holdout_split(train[:1], 0.5, 0)


def test_from_config(tmp_path):
    (tmp_path / "train.txt").write_text("a\nb\nc\nd\n")
    config = default_config()
    config.train.train_policy.dataset.local_dir = str(tmp_path)
    config.validation.dataset.holdout_fraction = 0.5
    train, val = prompt_splits_from_config(config)
    assert len(train) == 2 and len(val) == 2
