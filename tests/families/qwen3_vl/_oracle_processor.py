"""Oracle: transformers 5.23.0's Qwen3-VL processors, run in the oracle venv (torch + torchvision).

Usage: python _oracle_processor.py WORKDIR SHIM_FILE
WORKDIR holds `cases.json`, `inputs.npz` and `model/`; writes `<case>.npz` per case (and `<case>.txt`
with the expanded text). Never imported by the project's tests: it runs in another interpreter.
"""
import json
import sys
from pathlib import Path

exec(Path(sys.argv[2]).read_text())  # the torchvision import shim from tests/_support/oracle_env.py

import numpy as np  # noqa: E402
from transformers import AutoImageProcessor, AutoProcessor  # noqa: E402
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil  # noqa: E402


def _load(model: str) -> tuple:
    return (AutoProcessor.from_pretrained(model), AutoImageProcessor.from_pretrained(model),
            Qwen2VLImageProcessorPil.from_pretrained(model))


def main() -> None:
    work = Path(sys.argv[1])
    cases = json.loads((work / "cases.json").read_text())
    arrays = np.load(work / "inputs.npz")
    loaded = {}
    for case in cases:
        model = case.get("model", "model")
        if model not in loaded:
            loaded[model] = _load(str(work / model))
        processor, fast_images, pil_images = loaded[model]  # fast = the torchvision image backend
        out = {}
        if case["kind"] == "images":  # image processors alone, both backends
            images = [arrays[k] for k in case["images"]]
            for tag, proc in (("pil", pil_images), ("fast", fast_images)):
                res = proc(images=images, return_tensors="np")
                out[f"{tag}_pixel_values"] = np.asarray(res["pixel_values"])
                out[f"{tag}_image_grid_thw"] = np.asarray(res["image_grid_thw"])
        else:  # the full processor on chat-templated text
            texts = [processor.apply_chat_template(m, tokenize=False, add_generation_prompt=True)
                     for m in case["messages"]]
            kwargs = {}
            images = [arrays[k] for k in case.get("images", [])]
            if images:
                kwargs["images"] = images
            videos = case.get("videos", [])
            if videos:
                kwargs["videos"] = [arrays[v["key"]] for v in videos]
                kwargs["video_metadata"] = [
                    {"total_num_frames": len(arrays[v["key"]]), "fps": v["video_fps"],
                     "frames_indices": v.get("indices", list(range(len(arrays[v["key"]]))))}
                    for v in videos]
                kwargs.update(case.get("videos_kwargs", {}))
            res = processor(text=texts, padding=True, padding_side="left", return_tensors="np", **kwargs)
            for k, v in res.items():
                out[k] = np.asarray(v)
            (work / f"{case['name']}.txt").write_text(json.dumps(texts))
        np.savez(work / f"{case['name']}.npz", **out)
    processor, fast_images, _ = loaded["model"]
    info = {"processor": type(processor).__name__,
            "image_processor": type(processor.image_processor).__name__,
            "fast_image_processor": type(fast_images).__name__,
            "video_processor": type(processor.video_processor).__name__}
    (work / "info.json").write_text(json.dumps(info))


if __name__ == "__main__":
    main()
