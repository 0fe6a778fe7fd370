"""The prefill-time model E_C(R, P) (design.md section 2).

A degree-C worker prefilling R uncached tokens on top of a cached prefix of P
tokens takes

    E_C(R, P) = d_C + a_C·R + b·P + (c·R + α·W(R, P)) / C

seconds, where W(R, P) = R·P + R(R+1)/2 is the number of causal query–key
pairs the R new tokens attend to. ``d_C`` is the fixed start-up cost, ``a_C``
the per-token cost that does not shrink with C (communication, sync, data
movement), ``b`` the cost of reading the cached prefix, ``c`` the token-local
compute (projections, FFN/MoE) split over the ranks and ``α`` attention.

The coefficients are data (a profile per model–hardware pair), never
constants in code: see :mod:`vertumnus.profiles` for loading and
:mod:`vertumnus.core.fit` for fitting them from measurements.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


def attention_pairs(uncached: int, cached: int) -> int:
    """W(R, P): causal query–key pairs of R new tokens after P cached ones."""
    return uncached * cached + uncached * (uncached + 1) // 2


@dataclass(frozen=True)
class PrefillModel:
    """Fitted coefficients of E_C(R, P) for one model–hardware pair (seconds)."""

    name: str
    alpha: float
    """Seconds per attention query–key pair (α)."""
    c: float
    """Seconds per uncached token of rank-splittable compute (c)."""
    b: float
    """Seconds per cached prefix token (b)."""
    d: Mapping[int, float]
    """Fixed start-up seconds per degree (d_C)."""
    a: Mapping[int, float]
    """Seconds per uncached token that do not shrink with C, per degree (a_C)."""
    max_tokens_per_gpu: int = 131072
    """Longest input one GPU's share of a worker can hold (memory limit); a
    degree-C worker fits C times this. Used by candidate filtering."""
    notes: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if set(self.d) != set(self.a):
            raise ValueError(f"profile {self.name!r}: d and a must cover the same degrees")
        if not self.d:
            raise ValueError(f"profile {self.name!r}: no degrees")
        for label, v in (("alpha", self.alpha), ("c", self.c), ("b", self.b)):
            if v < 0:
                raise ValueError(f"profile {self.name!r}: {label} must be >= 0, got {v}")
        for deg in self.d:
            if deg < 1 or self.d[deg] < 0 or self.a[deg] < 0:
                raise ValueError(f"profile {self.name!r}: bad coefficients for degree {deg}")

    @property
    def degrees(self) -> tuple[int, ...]:
        return tuple(sorted(self.d))

    def supports(self, degree: int) -> bool:
        return degree in self.d

    def predict(self, degree: int, uncached: int, cached: int) -> float:
        """E_C(R, P) in seconds."""
        w = uncached * cached + uncached * (uncached + 1) // 2
        return (
            self.d[degree]
            + self.a[degree] * uncached
            + self.b * cached
            + (self.c * uncached + self.alpha * w) / degree
        )

    def max_tokens(self, degree: int) -> int:
        return self.max_tokens_per_gpu * degree

    def speedup(self, degree: int, length: int) -> float:
        """Isolated speedup of degree C over degree 1 at ``length`` uncached tokens."""
        return self.predict(1, length, 0) / self.predict(degree, length, 0)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "alpha_s_per_pair": self.alpha,
            "c_s_per_token": self.c,
            "b_s_per_cached_token": self.b,
            "max_tokens_per_gpu": self.max_tokens_per_gpu,
            "degrees": {
                str(deg): {"d_s": self.d[deg], "a_s_per_token": self.a[deg]} for deg in self.degrees
            },
            "notes": self.notes,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PrefillModel:
        """Build from the profile file layout; raise ValueError naming a missing/bad field."""
        name = str(data.get("name", "unnamed"))
        try:
            degrees = data["degrees"]
            d = {int(k): float(v["d_s"]) for k, v in degrees.items()}
            a = {int(k): float(v["a_s_per_token"]) for k, v in degrees.items()}
            return cls(
                name=name,
                alpha=float(data["alpha_s_per_pair"]),
                c=float(data["c_s_per_token"]),
                b=float(data.get("b_s_per_cached_token", 0.0)),
                d=d,
                a=a,
                max_tokens_per_gpu=int(data.get("max_tokens_per_gpu", 131072)),
                notes=str(data.get("notes", "")),
            )
        except KeyError as e:
            raise ValueError(f"profile {name!r}: missing field {e.args[0]!r}") from None
        except (TypeError, AttributeError, ValueError) as e:
            raise ValueError(f"profile {name!r}: malformed coefficients ({e})") from None
