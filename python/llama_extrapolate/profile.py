"""Calibration profiles: the temperatures ``llama-extrapolate calibrate`` found, as a JSON file.

A profile belongs to one model file (name + SHA-256) and one training length
L_tr. For each alignment mode (pmax, entropy) and granularity (global, layer,
head) it holds tau at each extrapolation length L_ex; between lengths tau is
interpolated linearly in log length, with tau = 1 at L_tr, which is how
``AttentionConfig.from_profile`` turns it into a temperature for one length or
a schedule tau(p) for a growing stream.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import List, Optional, Tuple, Union

import numpy as np

FORMAT = "llama-extrapolate/calibration-profile/1"
_SEARCH_PREFERENCE = ("continuous", "refined", "grid")


def file_sha256(path: Union[str, Path]) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


@dataclass
class CalibrationProfile:
    model_name: str
    model_sha256: str
    training_length: int
    entries: List[dict] = field(default_factory=list)  # {mode, granularity, search, length, tau, ...}
    text: str = ""
    queries: str = "all"
    extra: dict = field(default_factory=dict)  # baselines, propositions, measurements

    def add(self, mode: str, granularity: str, search: str, length: int, tau, **details) -> None:
        tau = np.asarray(tau, dtype=np.float64)
        self.entries = [e for e in self.entries
                        if (e["mode"], e["granularity"], e["search"], e["length"]) != (mode, granularity, search, length)]
        self.entries.append({"mode": mode, "granularity": granularity, "search": search, "length": int(length),
                             "tau": tau.tolist(), **details})

    # --- files -----------------------------------------------------------------------------------
    def save(self, path: Union[str, Path]) -> None:
        data = {"format": FORMAT, **asdict(self)}
        Path(path).write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")

    @classmethod
    def load(cls, path: Union[str, Path]) -> "CalibrationProfile":
        path = Path(path)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise FileNotFoundError(f"calibration profile {path} does not exist: make one with "
                                    "`llama-extrapolate calibrate --output PATH`") from None
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ValueError(f"{path} is not a calibration profile (not JSON: {e})") from None
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ValueError(f"{path} is not a calibration profile: its format is "
                             f"{data.get('format') if isinstance(data, dict) else type(data).__name__!r}, "
                             f"expected {FORMAT!r}")
        data.pop("format")
        try:
            prof = cls(**data)
        except TypeError as e:
            raise ValueError(f"{path}: malformed calibration profile ({e})") from None
        for e in prof.entries:
            if not {"mode", "granularity", "search", "length", "tau"} <= set(e):
                raise ValueError(f"{path}: profile entry {e} lacks mode/granularity/search/length/tau")
        return prof

    def check_model(self, model_path: Union[str, Path]) -> None:
        digest = file_sha256(model_path)
        if digest != self.model_sha256:
            raise ValueError(f"the profile was calibrated on {self.model_name} (sha256 {self.model_sha256[:12]}…), "
                             f"not on {model_path} (sha256 {digest[:12]}…): calibrate this model first")

    # --- lookups ---------------------------------------------------------------------------------
    def series(self, mode: str = "pmax", granularity: str = "global") -> List[Tuple[int, np.ndarray]]:
        """(L_ex, tau) by length for one mode and granularity, the most precise search at each length."""
        by_length = {}
        for e in self.entries:
            if e["mode"] != mode or e["granularity"] != granularity:
                continue
            rank = _SEARCH_PREFERENCE.index(e["search"]) if e["search"] in _SEARCH_PREFERENCE else 99
            if e["length"] not in by_length or rank < by_length[e["length"]][0]:
                by_length[e["length"]] = (rank, np.asarray(e["tau"], dtype=np.float64))
        if not by_length:
            have = sorted({(e["mode"], e["granularity"]) for e in self.entries})
            raise ValueError(f"the profile has no {mode}/{granularity} temperatures; it has {have}")
        return [(L, t) for L, (_, t) in sorted(by_length.items())]

    def points(self, mode: str = "pmax", granularity: str = "global") -> Tuple[Tuple[int, object], ...]:
        """Schedule points: tau = 1 at L_tr, then the calibrated tau at each L_ex."""
        ser = self.series(mode, granularity)
        one = np.ones_like(ser[0][1])
        pts = [(self.training_length, one)] + [(L, t) for L, t in ser if L > self.training_length]
        return tuple((int(L), t.tolist() if t.ndim else float(t)) for L, t in pts)

    def temperature_fields(self, mode: str = "pmax", granularity: str = "global",
                           length: Optional[int] = None) -> dict:
        """The AttentionConfig fields that apply this profile: the tau it gives at ``length``, or without a
        length a schedule tau(p) through its points (a stream sharpened as it grows). Every route from a
        profile to a configuration goes through here, so the mode is always the caller's choice."""
        if length is not None:
            return {"temperature": self.temperature(length, mode, granularity)}
        return {"temperature_schedule": "points", "temperature_points": self.points(mode, granularity)}

    def temperature(self, length: int, mode: str = "pmax", granularity: str = "global"):
        """tau for inputs of ``length`` tokens: interpolated in log length, 1 up to L_tr, held past the last."""
        if length < 1:
            raise ValueError(f"length={length} must be >= 1")
        pts = self.points(mode, granularity)
        xs = [math.log(L) for L, _ in pts]
        ts = [np.asarray(t, dtype=np.float64) for _, t in pts]
        x = math.log(length)
        if x <= xs[0]:
            out = ts[0]
        elif x >= xs[-1]:
            out = ts[-1]
        else:
            k = next(i for i in range(1, len(xs)) if xs[i] >= x)
            w = (x - xs[k - 1]) / (xs[k] - xs[k - 1])
            out = ts[k - 1] + w * (ts[k] - ts[k - 1])
        return float(out) if out.ndim == 0 else out
