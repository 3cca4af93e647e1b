"""transformers' Muse Glimmer processing code, run without torchvision. Its
image and video processors import torchvision at the top of their modules
(not in the test extra: no torchvision wheel for torch's CPU build is on the
package index), so their functions and class settings are taken from the
source (``ast``: the module's imports are not run); the processor itself
(``processing_muse_glimmer``) imports without it and is built over a
stand-in video processor holding those settings."""
from __future__ import annotations

import ast
import itertools
import logging
import math
from types import SimpleNamespace
from typing import Any

import pytest
import torch


def _tree(module: str) -> tuple[str, ast.Module]:
    import importlib.util
    path = importlib.util.find_spec(f"transformers.models.muse_glimmer.{module}").origin
    return path, ast.parse(open(path).read())


def functions(module: str, names: list[str]) -> dict:
    """Functions (``name`` or ``Class.method``) from a transformers module's source, compiled alone."""
    path, tree = _tree(module)
    out = {}
    for name in names:
        cls, _, fn = name.rpartition(".")
        body = tree.body
        if cls:
            body = next(n for n in body if isinstance(n, ast.ClassDef) and n.name == cls).body
        node = next(n for n in body if isinstance(n, ast.FunctionDef) and n.name == fn)
        node.decorator_list = []
        ns = {"itertools": itertools, "math": math, "torch": torch, "logger": logging.getLogger(module)}
        exec(compile(ast.Module([node], []), path, "exec"), ns)
        out[name] = ns[fn]
    return out


def class_settings(module: str, cls: str) -> dict[str, Any]:
    """A class's plain settings (``name = literal`` in its body) from the source."""
    _, tree = _tree(module)
    body = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls).body
    out = {}
    for node in body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                out[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                pass     # a setting named from elsewhere (a constant, an enum)
    return out


def video_processor() -> SimpleNamespace:
    """A stand-in MuseGlimmerVideoProcessor: its class settings, and its
    ``sample_frames`` bound to them."""
    vp = SimpleNamespace(**class_settings("video_processing_muse_glimmer", "MuseGlimmerVideoProcessor"))
    sample = functions("video_processing_muse_glimmer", ["MuseGlimmerVideoProcessor.sample_frames"])
    vp.sample_frames = lambda **kw: sample["MuseGlimmerVideoProcessor.sample_frames"](vp, **kw)
    return vp


def processor(tokenizer) -> Any:
    """transformers' own MuseGlimmerProcessor over ``tokenizer`` (a
    PreTrainedTokenizerFast), its video processor the stand-in above. Only
    ProcessorMixin's constructor is skipped: it insists on processor classes
    that need torchvision."""
    from transformers.models.muse_glimmer.processing_muse_glimmer import MuseGlimmerProcessor
    from transformers.processing_utils import ProcessorMixin
    mp = pytest.MonkeyPatch()
    mp.setattr(ProcessorMixin, "__init__", lambda self, *a, **kw: None)
    try:
        proc = MuseGlimmerProcessor(tokenizer=tokenizer)
    finally:
        mp.undo()
    proc.tokenizer = tokenizer
    proc.video_processor = video_processor()
    return proc
