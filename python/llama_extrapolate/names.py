"""Named configurations: the names evaluations, plots, tables and benchmarks store results under.

A name is a small language: a baseline ("lambda", "vanilla", ...), "lambda+top-k", "profile=PATH", or a document
memory "lambda+memory[:m=N[:c=C]][:last=T][:STORE][:principal][:lm=L][:passages][:layer][:hold]" (T: the question's
last tokens whose queries select, all when left out; STORE: the store's type, q4_0, q8_0, f16 or f32; the library's
choice for the model when left out; principal: the blocks summarized along the principal axes of the document's first
keys, the key channels when left out; L: the blocks ranked by landmarks, the means of runs of L keys, instead of the
bound). ``NamedConfig.parse`` reads one (and names a malformed
part), ``.name`` gives the canonical spelling results are stored under (the memory's m and c always written, since
the defaults have changed over time), ``.label()`` the human label of tables and plots.

This module imports nothing from the package at import time (the memory's defaults are read from ``config`` only
when a name leaves them out), so a script that reads results without loading the library may load this file
alone and call ``NamedConfig.parse(name).label()`` on the stored (canonical) names.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

BASELINES = ("lambda", "vanilla", "context-shift", "window-only", "lambda-only", "ceiling-only", "log-length")
# retrieval tasks only: the document is read with the Lambda mask, the question adds the top-k middle keys
TOP_K_CONFIG = "lambda+top-k"
# retrieval tasks only: the document is read with the bounded Lambda cache and goes to the document memory, the
# question selects m blocks per KV head and takes the top-5 keys among them (or whole blocks with ":passages")
MEMORY_CONFIG = "lambda+memory"
# full attention with a calibration profile's schedule: "profile=" + the profile's path
PROFILE_CONFIG_PREFIX = "profile="
# the KV heads of a layer select the same blocks ("lambda+memory:m=64:c=1024:layer")
MEMORY_LAYER_SUFFIX = ":layer"
# before ":layer": the question reads every key of the selected blocks in the order of the text (top_k = m * B)
MEMORY_PASSAGES_SUFFIX = ":passages"
# after ":c=C": the store's type (":q4_0"); left out, q8_0 (options.NAMED_CONFIG_STORE: what the results stored under
# such names ran with, not the library's default), f16 for heads not a multiple of 32
MEMORY_STORE_TYPES = ("q8_0", "q4_0", "f16", "f32")
# the memory file's record layout (patch 0012's RECORD_LAYOUT, the header's first field), which memory results record
# as "store_layout": 3 since 2026-12-06, the values stored a channel at a time and read as they are; 2 before (absent
# from older results), the values stored as the keys are and rounded again across the cells at the question
MEMORY_STORE_LAYOUT = 3
# after the store's type: the block summaries along the principal axes of the document's first keys (memory_axes)
MEMORY_AXES_SUFFIX = ":principal"
# after the axes: the blocks ranked by the means of runs of L keys (memory_landmark), not by the bound
MEMORY_LANDMARK_PREFIX = ":lm="
# after ":c=C": only the question's last T tokens' queries select its blocks (Llama.set_memory_question)
MEMORY_LAST_PREFIX = ":last="
# last of all: the answer attends to the blocks its question selected (Llama.memory_hold) instead of selecting anew
# at every answer token
MEMORY_HOLD_SUFFIX = ":hold"

LABELS = {"lambda": "Λ + ceiling", TOP_K_CONFIG: "Λ + top-k (whole cache)", "vanilla": "vanilla (full attention)",
          "context-shift": "context shift"}


@dataclass(frozen=True)
class NamedConfig:
    """One named configuration. ``base`` is a baseline, TOP_K_CONFIG, MEMORY_CONFIG or "profile"; the memory's
    fields are set for MEMORY_CONFIG only, ``profile`` (a path) for "profile" only."""

    base: str
    profile: Optional[str] = None
    memory_blocks: Optional[int] = None
    memory_candidates: Optional[int] = None  # 0: Quest's bound alone selects
    memory_selection: str = "head"
    passages: bool = False
    hold: bool = False
    memory_type: Optional[str] = None  # the store's type; None: options.NAMED_CONFIG_STORE
    select_tokens: int = 0  # the question's last tokens whose queries select (0: all)
    principal_axes: bool = False  # the block summaries along the principal axes of the first keys
    landmark: int = 0  # tokens a landmark averages (0: the bound ranks the blocks)

    def __post_init__(self) -> None:
        known = (*BASELINES, TOP_K_CONFIG, MEMORY_CONFIG, "profile")
        if self.base not in known:
            raise ValueError(f"configuration {self.base!r}: use one of {', '.join(BASELINES)}, {TOP_K_CONFIG} or "
                             f"{MEMORY_CONFIG}[:m=N] (passkey, needle) or {PROFILE_CONFIG_PREFIX}PATH")
        if (self.base == "profile") != bool(self.profile):
            raise ValueError(f"configuration {self.base!r} with profile={self.profile!r}: a profile path goes with "
                             f"{PROFILE_CONFIG_PREFIX}PATH only")
        memory = self.base == MEMORY_CONFIG
        if memory != (self.memory_blocks is not None) or memory != (self.memory_candidates is not None):
            raise ValueError(f"configuration {self.base!r}: memory_blocks and memory_candidates are given for "
                             f"{MEMORY_CONFIG} and only for it")
        if not memory and (self.passages or self.memory_selection != "head" or self.hold or self.memory_type
                           or self.select_tokens or self.principal_axes or self.landmark):
            raise ValueError(f"configuration {self.base!r}: passages, memory_selection, hold, last, the store's "
                             f"type, principal and lm need {MEMORY_CONFIG}")
        if isinstance(self.select_tokens, bool) or not isinstance(self.select_tokens, int) or self.select_tokens < 0:
            raise ValueError(f"configuration {self.base!r}: last={self.select_tokens!r}: give a whole number >= 1 "
                             f"(or leave it out: every token of the question selects)")
        if self.memory_type is not None and self.memory_type not in MEMORY_STORE_TYPES:
            raise ValueError(f"configuration {self.base!r}: store type {self.memory_type!r}: use one of "
                             f"{', '.join(MEMORY_STORE_TYPES)}")
        if memory:
            if self.memory_blocks < 1:
                raise ValueError(f"configuration {self.name!r}: m must be a whole number >= 1, as in "
                                 f"{MEMORY_CONFIG}:m=64")
            if self.memory_candidates != 0 and self.memory_candidates <= self.memory_blocks:
                raise ValueError(f"configuration {self.name!r}: c must be 0 (the bound selects) or a whole number "
                                 f"> m")
            if self.memory_selection not in ("head", "layer"):
                raise ValueError(f"memory_selection {self.memory_selection!r}: use 'head' or 'layer'")

    @property
    def is_memory(self) -> bool:
        return self.base == MEMORY_CONFIG

    @classmethod
    def is_memory_name(cls, name: str) -> bool:
        """Whether ``name`` is spelled as a document-memory configuration (malformed or not)."""
        return name == MEMORY_CONFIG or name.startswith(MEMORY_CONFIG + ":")

    @staticmethod
    def _take_count(whole: str, rest: str, prefix: str, what: str, example: int) -> tuple:
        """(rest without its last ``prefix``N, N), or (rest, 0) without one; ValueError when N is not a count."""
        head, sep, text = rest.rpartition(prefix)
        if not sep:
            return rest, 0
        if not text.isdigit() or int(text) < 1:
            raise ValueError(f"configuration {whole!r}: {prefix.strip(':=')} must be a whole number >= 1 ({what}), "
                             f"as in {MEMORY_CONFIG}{prefix}{example}")
        return head, int(text)

    @classmethod
    def parse(cls, name: str, *, stored: bool = False) -> "NamedConfig":
        """The configuration a name spells; ValueError names the malformed part and shows a good spelling.

        ``stored``: the name comes from a results file, where a memory without ":c=" was run before the candidates
        existed (Quest's bound alone selected, c = 0) rather than with today's default c."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"configuration {name!r}: give a name such as lambda or {MEMORY_CONFIG}:m=64")
        if name.startswith(PROFILE_CONFIG_PREFIX):
            return cls("profile", profile=name[len(PROFILE_CONFIG_PREFIX):])
        if not cls.is_memory_name(name):
            return cls(name)
        whole, rest = name, name
        selection, passages, hold = "head", False, False
        if rest.endswith(MEMORY_HOLD_SUFFIX):
            rest, hold = rest[:-len(MEMORY_HOLD_SUFFIX)], True
        if rest.endswith(MEMORY_LAYER_SUFFIX):
            rest, selection = rest[:-len(MEMORY_LAYER_SUFFIX)], "layer"
        if rest.endswith(MEMORY_PASSAGES_SUFFIX):
            rest, passages = rest[:-len(MEMORY_PASSAGES_SUFFIX)], True
        rest, landmark = cls._take_count(whole, rest, MEMORY_LANDMARK_PREFIX, "tokens a landmark averages", 16)
        principal = rest.endswith(MEMORY_AXES_SUFFIX)
        if principal:
            rest = rest[:-len(MEMORY_AXES_SUFFIX)]
        memory_type = next((t for t in MEMORY_STORE_TYPES if rest.endswith(":" + t)), None)
        if memory_type is not None:
            rest = rest[:-len(memory_type) - 1]
        rest, last = cls._take_count(whole, rest, MEMORY_LAST_PREFIX, "the question's last tokens that select", 32)
        if rest == MEMORY_CONFIG:
            from .config import DEFAULT_MEMORY_BLOCKS, MEMORY_CANDIDATES_PER_BLOCK

            m, c = DEFAULT_MEMORY_BLOCKS, MEMORY_CANDIDATES_PER_BLOCK * DEFAULT_MEMORY_BLOCKS
            return cls(MEMORY_CONFIG, memory_blocks=m, memory_candidates=c, memory_selection=selection,
                       passages=passages, hold=hold, memory_type=memory_type, select_tokens=last,
                       principal_axes=principal, landmark=landmark)
        prefix = MEMORY_CONFIG + ":m="
        if not rest.startswith(prefix):
            raise ValueError(f"configuration {whole!r}: spell a memory as {MEMORY_CONFIG}[:m=N[:c=C]][:last=T][:q4_0]"
                             f"[:principal][:lm=L][:passages][:layer][:hold], e.g. {prefix}64")
        m_text, _, c_text = rest[len(prefix):].partition(":c=")
        if not m_text.isdigit() or int(m_text) < 1:
            raise ValueError(f"configuration {whole!r}: m must be a whole number >= 1, as in {prefix}64")
        m = int(m_text)
        if c_text and c_text.isdigit() and (int(c_text) == 0 or int(c_text) > m):
            c = int(c_text)
        elif not c_text and stored:
            c = 0
        else:
            # only here are today's defaults needed: a stored name with its m and c parses without the package
            from .config import MEMORY_CANDIDATES_PER_BLOCK

            if c_text:
                raise ValueError(f"configuration {whole!r}: c must be 0 (the bound selects) or a whole number > m, "
                                 f"as in {prefix}{m}:c={MEMORY_CANDIDATES_PER_BLOCK * m}")
            c = MEMORY_CANDIDATES_PER_BLOCK * m
        return cls(MEMORY_CONFIG, memory_blocks=m, memory_candidates=c, memory_selection=selection,
                   passages=passages, hold=hold, memory_type=memory_type, select_tokens=last,
                   principal_axes=principal, landmark=landmark)

    @property
    def name(self) -> str:
        """The canonical name results are stored under (a memory's m and c always written)."""
        if self.base == "profile":
            return PROFILE_CONFIG_PREFIX + str(self.profile)
        if not self.is_memory:
            return self.base
        return (f"{MEMORY_CONFIG}:m={self.memory_blocks}:c={self.memory_candidates}"
                + (f"{MEMORY_LAST_PREFIX}{self.select_tokens}" if self.select_tokens else "")
                + (f":{self.memory_type}" if self.memory_type else "")
                + (MEMORY_AXES_SUFFIX if self.principal_axes else "")
                + (f"{MEMORY_LANDMARK_PREFIX}{self.landmark}" if self.landmark else "")
                + (MEMORY_PASSAGES_SUFFIX if self.passages else "")
                + (MEMORY_LAYER_SUFFIX if self.memory_selection == "layer" else "")
                + (MEMORY_HOLD_SUFFIX if self.hold else ""))

    def label(self, block_size: int = 64) -> str:
        """The label of tables and plots: "Λ + memory (m = 64, 1024 candidates, B = 64, k = 5)", a profile by its
        file name, a baseline by its description (its name where it has none)."""
        if self.base == "profile":
            return PROFILE_CONFIG_PREFIX + os.path.basename(str(self.profile))
        if not self.is_memory:
            return LABELS.get(self.base, self.base)
        rerank = f", {self.memory_candidates} candidates" if self.memory_candidates else ", bound only"
        layer = ", per layer" if self.memory_selection == "layer" else ""
        keys = "whole blocks in text order" if self.passages else "k = 5"
        hold = ", answer holds the question's blocks" if self.hold else ""
        store = f", {self.memory_type} store" if self.memory_type else ""
        last = f", the question's last {self.select_tokens} tokens select" if self.select_tokens else ""
        axes = ", principal axes" if self.principal_axes else ""
        landmarks = f", landmarks of {self.landmark}" if self.landmark else ""
        if self.landmark and not self.memory_candidates:
            rerank, landmarks = f", landmarks of {self.landmark} only", ""
        return (f"Λ + memory (m = {self.memory_blocks}{rerank}{landmarks}{last}{layer}{axes}, B = {block_size}, "
                f"{keys}{store}{hold})")
