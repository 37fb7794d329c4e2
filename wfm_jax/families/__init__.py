"""Model families: one `PipelineFamily` subclass per diffusers pipeline class, all named in FAMILIES.

FAMILIES maps the recipes' `policy.family` name to its class as a lazy "module:attr" string, so
importing this package imports no family. A new family adds one line here (and its own folder);
tests and users may `FAMILIES.register(name, cls)` their own.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from wfm_jax.core.registry import Registry

if TYPE_CHECKING:
    from wfm_jax.families.base import PipelineFamily

FAMILIES: Registry[type[PipelineFamily]] = Registry("model family", {
    "sd3": "wfm_jax.families.sd3.pipeline:SD3Pipeline",
    "wan": "wfm_jax.families.wan.pipeline:WanPipeline",
    "cosmos": "wfm_jax.families.cosmos.pipeline:CosmosPipeline",
    "sana": "wfm_jax.families.sana.pipeline:SanaPipeline",
    "sana_video": "wfm_jax.families.sana.video_pipeline:SanaVideoPipeline",
})
