"""Text rewards of cosmos-rl's language-model post-training (cosmos_rl/dispatcher/algo/reward.py),
the ones the Cosmos-Reason recipes name in ``train.train_policy.reward_function``:

  format         1 iff the whole completion is ``<think>...</think>\\n\\n<answer>...</answer>`` (no
                 nested think tags; one trailing newline tolerated), else 0
  single_choice  1 iff the stripped inside of the first ``<answer>...</answer>`` of the completion (or
                 the whole stripped completion when it has none) equals the reference's, ignoring case
  boxed_math     math-verify: the reference parsed as LaTeX, the completion as expression or LaTeX
                 (``\\boxed{...}`` first), 1 iff they are equal; 0 when either fails to parse
  direct_math    +1 / -1: the last ``Answer: ...`` line against the reference, both normalised
  gsm8k          1 iff the first ``#### n`` of completion and reference agree

Each is a pure function of (completion, reference) and a local reward (``media="text"``) scoring a
batch ``fn(completions, prompts, extras)`` with ``extras["references"]``, one per completion.
Remotely they travel as media_type "text" (reward_client/protocol.py).
"""
from __future__ import annotations

import re
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from reward_client.errors import RewardValueError
from reward_client.registry import register_reward

# cosmos-rl's format_reward_fn pattern, verbatim in meaning: think (no nested <think>/</think>),
# a blank line, then one answer block that ends the text (`$` also matches before a final "\n").
FORMAT_PATTERN = r"^<think>([^<]*(?:<(?!/?think>)[^<]*)*)<\/think>\n\n<answer>([\s\S]*?)<\/answer>$"
# Cosmos-Reason2's own prompt style (cosmos_reason2_utils REASONING_PROMPT): think, a blank line,
# then a bare non-empty answer; cosmos-rl has no reward for it, so this one is ours (format_reason2).
REASON2_FORMAT_PATTERN = (r"^<think>([^<]*(?:<(?!/?think>)[^<]*)*)<\/think>\n\n"
                          r"(?![\s\S]*<\/?think>)(\S[\s\S]*)$")
ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
MATH_PRECISION = 6  # math_metric's default float rounding
MATH_TIMEOUT_S = 5  # math-verify's parse/verify defaults, used only where signal.alarm works


def format_reward(completion: str, pattern: str = FORMAT_PATTERN) -> float:
    return 1.0 if re.search(pattern, completion, re.DOTALL) else 0.0


def extract_answer(text: str) -> str:
    """Inside of the first <answer>...</answer>, stripped; the whole stripped text without one."""
    match = ANSWER_RE.search(text)
    return match.group(1).strip() if match else text.strip()


def single_choice_reward(completion: str, reference: str) -> float:
    return 1.0 if extract_answer(completion).lower() == extract_answer(reference).lower() else 0.0


def _math_verify():
    try:
        from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify
    except ImportError:
        raise RewardValueError("the boxed_math reward needs math-verify: pip install 'math-verify==0.9.0' "
                               "(or the wfm_jax 'reason' extra)") from None
    return parse, verify, (LatexExtractionConfig(),), (ExprExtractionConfig(), LatexExtractionConfig())


def boxed_math_reward(completion: str, reference: str) -> float:
    """cosmos-rl's ``math_metric(gold=(Latex,), pred=(Expr, Latex))([reference], [completion])`` with
    its errors as 0.0. Composed from math-verify's parse/verify (what math_metric does for one pair)
    so it also runs off the main thread: math-verify's timeouts use signal.alarm, which only the
    main thread may set, so elsewhere (the RewardComputer's worker, the server's pool) it runs
    without a timeout instead of scoring every answer 0."""
    parse, verify, gold_targets, pred_targets = _math_verify()
    timeout = MATH_TIMEOUT_S if threading.current_thread() is threading.main_thread() else None
    try:
        golds = parse(reference, gold_targets, parsing_timeout=timeout)
        if not golds:  # math_metric raises "No gold targets found"; cosmos-rl scores that 0
            return 0.0
        preds = parse(completion, pred_targets, parsing_timeout=timeout)
        return 1.0 if verify(golds, preds, MATH_PRECISION, timeout_seconds=timeout) else 0.0
    except Exception:  # cosmos-rl: TimeoutException and any other error -> 0.0
        return 0.0


# cosmos-rl's normalize_final_answer tables (from the MATH benchmark's Minerva normalisation).
_SUBSTITUTIONS = [("an ", ""), ("a ", ""), (".$", "$"), ("\\$", ""), (r"\ ", ""), (" ", ""),
                  ("mbox", "text"), (",\\text{and}", ","), ("\\text{and}", ","), ("\\text{m}", "\\text{}")]
_REMOVED = ["square", "ways", "integers", "dollars", "mph", "inches", "hours", "km", "units", "\\ldots",
            "sue", "points", "feet", "minutes", "digits", "cents", "degrees", "cm", "gm", "pounds", "meters",
            "meals", "edges", "students", "childrentickets", "multiples", "\\text{s}", "\\text{.}",
            "\\text{\ns}", "\\text{}^2", "\\text{}^3", "\\text{\n}", "\\text{}", r"\mathrm{th}", r"^\circ",
            r"^{\circ}", r"\;", r",\!", "{,}", '"', "\\dots"]


def normalize_final_answer(answer: str) -> str:
    answer = answer.split("=")[-1]
    for before, after in _SUBSTITUTIONS:
        answer = answer.replace(before, after)
    for expr in _REMOVED:
        answer = answer.replace(expr, "")
    answer = re.sub(r"(.*?)(\$)(.*?)(\$)(.*)", "$\\3$", answer)
    for command in ("text", "textbf", "overline"):
        answer = re.sub(rf"(\\{command}\{{)(.*?)(\}})", "\\2", answer)
    answer = re.sub(r"(\\boxed\{)(.*)(\})", "\\2", answer)
    answer = re.sub(r"(frac)([^{])(.)", "frac{\\2}{\\3}", answer)
    answer = re.sub(r"(sqrt)([^{])", "sqrt{\\2}", answer)
    answer = answer.replace("$", "")
    if answer.replace(",", "").isdigit():
        answer = answer.replace(",", "")
    return answer.strip()


def direct_math_reward(completion: str, reference: str,
                       answer_pattern: str = r"(?i)Answer\s*:\s*([^\n]+)") -> float:
    found = re.findall(answer_pattern, completion)
    pred = normalize_final_answer(found[-1] if found else "[INVALID]")
    return 1.0 if pred == normalize_final_answer(reference) else -1.0


def _gsm8k_answer(text: str) -> str | None:
    match = re.search(r"#### (\-?[0-9\.\,]+)", text)
    return match.group(0).split("#### ")[1].replace(",", "").replace("$", "") if match else None


def gsm8k_reward(completion: str, reference: str) -> float:
    # cosmos-rl compares the two extractions, so two answer-less texts also score 1 (None == None)
    return float(_gsm8k_answer(completion) == _gsm8k_answer(reference))


# -- batch adapters (the local-reward signature) ---------------------------------------------------
def references_of(name: str, extras: Mapping[str, Any], batch: int) -> list[str]:
    refs = extras.get("references")
    if refs is None:
        raise RewardValueError(f"text reward {name!r} needs the reference answers: pass "
                               "extras={'references': [one str per completion]}")
    if isinstance(refs, str) or not isinstance(refs, Sequence) or len(refs) != batch:
        n = "one string" if isinstance(refs, str) else (len(refs) if isinstance(refs, Sequence) else refs)
        raise RewardValueError(f"text reward {name!r}: extras['references'] has {n!r} entries for "
                               f"{batch} completions")
    return [str(r) for r in refs]


def _per_sample(name: str, fn, completions: list[str], extras: Mapping[str, Any]) -> np.ndarray:
    refs = references_of(name, extras, len(completions))
    return np.asarray([fn(c, r) for c, r in zip(completions, refs, strict=True)], np.float64)


@register_reward("format", media="text")
def format_batch(completions, prompts, extras):
    """extras["format_pattern"] (optional) replaces cosmos-rl's pattern; no references needed."""
    pattern = extras.get("format_pattern", FORMAT_PATTERN)
    return np.asarray([format_reward(c, pattern) for c in completions], np.float64)


@register_reward("format_reason2", media="text")
def format_reason2_batch(completions, prompts, extras):
    return np.asarray([format_reward(c, REASON2_FORMAT_PATTERN) for c in completions], np.float64)


@register_reward("single_choice", media="text")
def single_choice_batch(completions, prompts, extras):
    return _per_sample("single_choice", single_choice_reward, completions, extras)


@register_reward("boxed_math", media="text", setup=lambda: _math_verify())
def boxed_math_batch(completions, prompts, extras):
    return _per_sample("boxed_math", boxed_math_reward, completions, extras)


@register_reward("direct_math", media="text")
def direct_math_batch(completions, prompts, extras):
    return _per_sample("direct_math", direct_math_reward, completions, extras)


@register_reward("gsm8k", media="text")
def gsm8k_batch(completions, prompts, extras):
    return _per_sample("gsm8k", gsm8k_reward, completions, extras)
