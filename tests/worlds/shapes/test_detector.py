"""The independent shapes detector (worlds/shapes/detector.py): it reads the dataset's own drawings
right, keeps doing so when they are softened as a model's samples are, and says no when an
attribute is wrong."""
import cv2
import numpy as np
import pytest
from PIL import Image, ImageDraw

from wfm_jax.worlds.shapes.dataset import sample
from wfm_jax.worlds.shapes.detector import accuracy, correct, read_image
from wfm_jax.worlds.shapes.grammar import BACKGROUNDS, COLOURS, all_scenes


def _drawn(n: int, size: int, seed: int):
    scenes = all_scenes()
    pairs = [sample(i, seed, size, scenes) for i in range(n)]
    return np.stack([np.asarray(im) for im, _ in pairs]), [r["prompt"] for _, r in pairs]


@pytest.mark.parametrize("size", [32, 64])
def test_reads_every_drawn_scene_right_and_chance_is_the_grammars(size):
    images, prompts = _drawn(144, size, seed=11)  # every one of the 72 scenes twice
    got = accuracy(images, prompts)
    for key in ("background", "colour", "shape", "count", "all"):
        assert got[key] == 1.0, (key, got)
    # against every prompt: 1 in 2 backgrounds, 4 colours, 3 shapes, 3 counts
    assert got["chance_background"] == pytest.approx(1 / 2)
    assert got["chance_colour"] == pytest.approx(1 / 4)
    assert got["chance_shape"] == pytest.approx(1 / 3)
    assert got["chance_count"] == pytest.approx(1 / 3)


def test_soft_edges_as_a_models_samples_have_are_still_read():
    images, prompts = _drawn(144, 32, seed=12)
    soft = np.stack([cv2.GaussianBlur(x, (0, 0), 0.8) for x in images])
    noisy = np.clip(soft + np.random.default_rng(0).normal(0, 15, soft.shape), 0, 255).astype(np.uint8)
    got = accuracy(noisy, prompts)
    assert got["colour"] == 1.0 and got["background"] == 1.0
    assert got["shape"] >= 0.95 and got["count"] >= 0.9, got


def _canvas(background="white"):
    image = Image.new("RGB", (32, 32), BACKGROUNDS[background])
    return image, ImageDraw.Draw(image)


def test_each_wrong_attribute_is_a_miss_and_only_that_one():
    image, draw = _canvas("black")
    draw.rectangle((6, 6, 24, 24), fill=COLOURS["blue"])  # one blue square on black
    reading = read_image(np.asarray(image))
    assert reading["shapes"] == ["square"]
    assert all(correct(reading, "a blue square on a black background").values())
    cases = {"a blue circle on a black background": "shape",
             "a red square on a black background": "colour",
             "two blue squares on a black background": "count",
             "a blue square on a white background": "background"}
    for prompt, wrong in cases.items():
        hits = correct(reading, prompt)
        assert not hits[wrong]
        assert hits["all"] == (wrong == "background")  # `all` is colour, shape and count
        assert all(v for k, v in hits.items() if k not in (wrong, "all")), (prompt, hits)


def test_a_circle_and_a_triangle_of_one_box_are_told_apart():
    for shape, drawn in (("circle", "ellipse"), ("triangle", "polygon")):
        image, draw = _canvas()
        if drawn == "ellipse":
            draw.ellipse((5, 5, 26, 26), fill=COLOURS["green"])
        else:
            draw.polygon([(15.5, 5), (5, 26), (26, 26)], fill=COLOURS["green"])
        assert read_image(np.asarray(image))["shapes"] == [shape]


def test_nothing_drawn_is_wrong_on_everything_but_the_background():
    image, _ = _canvas()
    reading = read_image(np.asarray(image))
    assert reading["count"] == 0 and reading["colour"] is None and reading["shape"] is None
    hits = correct(reading, "a red circle on a white background")
    assert hits == {"background": True, "colour": False, "shape": False, "count": False, "all": False}


def test_specks_are_not_counted_and_touching_shapes_are_one():
    image, draw = _canvas()
    draw.rectangle((4, 4, 14, 14), fill=COLOURS["red"])
    draw.point((28, 28), fill=COLOURS["red"])  # a one-pixel speck
    assert read_image(np.asarray(image))["count"] == 1
    draw.rectangle((15, 4, 25, 14), fill=COLOURS["red"])  # touches the first
    assert read_image(np.asarray(image))["count"] == 1


def test_mismatched_lengths_are_refused():
    images, prompts = _drawn(2, 32, seed=0)
    with pytest.raises(ValueError, match="2 images for 1 prompts"):
        accuracy(images, prompts[:1])


@pytest.mark.parametrize("size", [32, 64])
def test_reads_the_size_of_sized_scenes_and_only_where_asked(size):
    from wfm_jax.worlds.shapes.grammar import SIZES, draw_scene

    rng = np.random.default_rng(13)
    scenes = [s.sized(z) for s in all_scenes() for z in SIZES]
    images = np.stack([np.asarray(draw_scene(s, size, rng)[0]) for s in scenes])
    prompts = [s.prompt for s in scenes]
    got = accuracy(images, prompts)
    assert got["size"] == 1.0 and got["shape"] == 1.0 and got["count"] == 1.0, got
    # against every prompt: near 1 in 2 (the boundary moves with the asked count and shape)
    assert got["chance_size"] == pytest.approx(1 / 2, abs=0.03)
    soft = np.stack([cv2.GaussianBlur(x, (0, 0), 0.8 * size / 32) for x in images])
    assert accuracy(soft, prompts)["size"] >= 0.95
    wrong = [s.sized(SIZES[1 - SIZES.index(s.size)]).prompt for s in scenes]
    assert accuracy(images, wrong)["size"] == 0.0
    assert "size" not in accuracy(images, [s.sized(None).prompt for s in scenes])
