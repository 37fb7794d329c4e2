"""OCR reward with the real rapidocr-onnxruntime model (weights ship in its wheel) on rendered text."""
import glob

import numpy as np
import pytest
from PIL import Image, ImageDraw, ImageFont

from reward_client.computer import RewardComputer
from reward_client.errors import RewardUnavailableError

pytest.importorskip("rapidocr_onnxruntime")


def _font(size):
    for pattern in ("/usr/share/fonts/**/DejaVuSans-Bold.ttf", "/usr/share/fonts/**/*.ttf"):
        found = sorted(glob.glob(pattern, recursive=True))
        if found:
            return ImageFont.truetype(found[0], size)
    return ImageFont.load_default(size=size)


def render(text, side=256):
    """Big dark text, centred with a wide margin, on a light square image."""
    font = _font(56)
    image = Image.new("RGB", (side, side), (236, 232, 220))
    draw = ImageDraw.Draw(image)
    left, top, right, bottom = draw.textbbox((0, 0), text, font=font)
    draw.text(((side - right - left) // 2, (side - bottom - top) // 2), text, fill=(20, 20, 30), font=font)
    return np.asarray(image)


def test_ocr_scores_rendered_hello():
    hello = render("HELLO")
    images = np.stack([hello, hello])
    prompts = ['a sign that says "hello"', 'a sign that says "world"']
    with RewardComputer([{"name": "ocr", "weight": 1.0}]) as rc:
        rc.check_reachable()  # loads the model
        res = rc.score(images, prompts)
    assert res.per_fn["ocr"][0] == 1.0
    assert res.per_fn["ocr"][1] <= 0.5  # "hello" vs "world": 4 edits of 5 characters
    assert np.allclose(res.total, res.per_fn["ocr"])


def test_ocr_needs_quoted_text():
    with RewardComputer([{"name": "ocr"}]) as rc:
        with pytest.raises(RewardUnavailableError, match="prompt 0 .* no text between double quotes"):
            rc.score(np.zeros((1, 32, 32, 3), np.uint8), ["no quotes here"])
