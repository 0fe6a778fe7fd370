"""Reading a Prometheus text exposition in tests, with Prometheus' own parser."""

from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from vertumnus.operator.metrics import OperatorMetrics

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(text: str) -> Samples:
    """Every sample of an exposition: (name, labels) → value."""
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def scrape(metrics: OperatorMetrics) -> Samples:
    return parse(generate_latest(metrics.registry).decode())


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def series(samples: Samples, name: str) -> list[dict[str, str]]:
    """The label sets ``name`` has samples for."""
    return [dict(labels) for n, labels in samples if n == name]
