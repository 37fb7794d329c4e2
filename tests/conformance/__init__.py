"""Conformance checks every model (and later every family and algorithm) inherits: a model test
subclasses a mixin and describes its tiny config, its diffusers class, its converter and its
inputs; the mixin supplies the checks (architecture.md §6)."""
from tests.conformance.converter import ConverterConformance
from tests.conformance.model import ModelConformance

__all__ = ["ConverterConformance", "ModelConformance"]
