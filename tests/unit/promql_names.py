"""Just enough PromQL reading to check dashboards and alerts name real metrics.

promtool is not at hand, so the expressions are tokenized here: strings, label
matchers, ranges, grouping clauses and dashboard variables are removed, and what
is left is functions, keywords, numbers and metric names. Anything else (an
unknown function, unbalanced brackets) is an error, so a typo cannot slip by.
"""

from __future__ import annotations

import re

from rota.metrics import metric_families, metric_types

_FUNCTION_NAMES = """
    abs absent absent_over_time avg avg_over_time bottomk ceil changes clamp clamp_max clamp_min
    count count_over_time count_values day_of_month delta deriv exp floor group
    histogram_quantile holt_winters idelta increase irate label_replace last_over_time ln log2
    max max_over_time min min_over_time predict_linear quantile quantile_over_time rate resets
    round scalar sgn sort sort_desc sqrt stddev sum sum_over_time time timestamp topk vector
"""
FUNCTIONS = frozenset(_FUNCTION_NAMES.split())
KEYWORDS = frozenset({"and", "or", "unless", "bool"})
OPERATOR_METRICS = {"rota_workerpool_replicas": "gauge"}
"""Served by the operator (rota_operator.metrics), not by rota.metrics."""
SCRAPE_SERIES = frozenset({"up"})
"""Written by Prometheus itself for every target it scrapes (1: the scrape worked)."""

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_VARIABLE = re.compile(r"\$\{?\w+\}?")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_OFFSET = re.compile(r"\boffset\s+-?\w+")
_TOKEN = re.compile(r"\d+(?:\.\d+)?(?:[eE][+-]?\d+)?[a-z]*|[A-Za-z_:][\w:]*|\S")


def known_metrics() -> set[str]:
    """Every sample name Rota serves: histograms' _bucket/_sum/_count, counters' _total."""
    names: set[str] = set()
    for name, kind in {**metric_types(), **OPERATOR_METRICS}.items():
        names |= _sample_names(name, kind)
    return names


def labelled_metrics(label: str) -> set[str]:
    """The sample names of the metrics whose series carry `label` (from the metric
    families Rota serves, so a new metric is classified as it is declared)."""
    names: set[str] = set()
    for family in metric_families():
        if label in family._labelnames:  # prometheus_client keeps them only here
            names |= _sample_names(family.name, family.type)
    return names


def _sample_names(name: str, kind: str) -> set[str]:
    if kind == "histogram":
        return {f"{name}{suffix}" for suffix in ("_bucket", "_sum", "_count")}
    return {f"{name}_total"} if kind == "counter" else {name}


def _balanced(text: str) -> bool:
    depth = 0
    for char in text:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth < 0:
            return False
    return depth == 0


def metric_names(expr: str) -> set[str]:
    """The metric names an expression reads; ValueError when it does not look like PromQL."""
    text = _STRING.sub('""', expr)
    text = _VARIABLE.sub("1", text)  # $__rate_interval -> "1" reads as a range of 1 second
    text = re.sub(r"\{[^{}]*\}", "", text)
    text = re.sub(r"\[[^\[\]]*\]", "", text)
    text = _OFFSET.sub("", _GROUPING.sub("", text))
    if not _balanced(text) or "{" in text or "[" in text:
        raise ValueError(f"unbalanced brackets in {expr!r}")
    names = set()
    for match in _TOKEN.finditer(text):
        token, rest = match.group(), text[match.end() :].lstrip()
        if not re.fullmatch(r"[A-Za-z_:][\w:]*", token) or token in KEYWORDS:
            continue
        if rest.startswith("("):
            if token not in FUNCTIONS:
                raise ValueError(f"unknown function {token!r} in {expr!r}")
            continue
        names.add(token)
    return names
