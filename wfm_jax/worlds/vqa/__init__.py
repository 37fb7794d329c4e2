"""The tiny VQA world: pictures of a 3x3 grid of coloured shapes with multiple-choice questions,
written as LLaVA-style JSON conversations (see scenes.py and dataset.py)."""
