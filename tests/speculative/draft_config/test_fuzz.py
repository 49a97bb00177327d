"""Fuzzing the draft YAML loader: any input loads or raises DraftConfigError, quickly.

Documents mix the real key names (at their real places and elsewhere) with random
keys and values of every YAML type; raw text and bytes cover what is not a YAML
mapping at all. Derandomized: the same examples on every run (CI).
"""

from __future__ import annotations

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from accel_plugin.speculative.draft_config import ControllerConfig, DefaultDraftConfig, DomainConfig, DraftConfig, DraftConfigError, MatchConfig, parse_draft_config

KEYS = sorted({*DraftConfig.model_fields, *DomainConfig.model_fields, *MatchConfig.model_fields,
               *DefaultDraftConfig.model_fields, *ControllerConfig.model_fields})
FUZZ = settings(max_examples=200, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(-3, 9), st.floats(allow_nan=True),
    st.text(max_size=12), st.sampled_from(["auto", "float16", "(a+)+$", "(a)\\1", "(?i)x", "[", "~", "..", "/", "."]),
)
keys = st.one_of(st.sampled_from(KEYS), st.text(max_size=8), st.integers(-2, 2), st.booleans())
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(keys, inner, max_size=4)),
    max_leaves=12,
)
plausible = st.one_of(st.integers(0, 9), st.floats(0, 2), st.booleans(), st.none())
controller = st.dictionaries(st.sampled_from(list(ControllerConfig.model_fields)), st.one_of(plausible, scalars),
                             max_size=5)
words = st.lists(st.one_of(st.text("abc +#", min_size=1, max_size=6), scalars), max_size=3)
match = st.dictionaries(st.sampled_from(["keywords", "regex", "words"]), st.one_of(words, scalars), max_size=3)
domain = st.fixed_dictionaries(
    {"draft": st.one_of(st.text(max_size=10), scalars), "match": st.one_of(match, values)},
    optional={"num_speculative_tokens": st.one_of(st.integers(1, 8), scalars), "extra": values},
)
sections = {
    "domains": st.one_of(st.dictionaries(st.one_of(st.text(max_size=6), st.just("default")), domain, max_size=3),
                         values),
    "default": st.one_of(st.fixed_dictionaries({}, optional={"draft": st.one_of(st.none(), scalars),
                                                             "num_speculative_tokens": plausible}), values),
    "controller": st.one_of(controller, values),
    "trust_remote_code": st.one_of(st.booleans(), scalars),
    "dtype": st.one_of(st.sampled_from(["auto", "float32", "bfloat16"]), scalars),
}
documents = st.one_of(
    st.fixed_dictionaries({"num_speculative_tokens": st.integers(1, 8)}, optional=sections),
    st.fixed_dictionaries({}, optional={"num_speculative_tokens": scalars, **sections}).flatmap(
        lambda doc: st.dictionaries(keys, values, max_size=2).map(lambda extra: {**extra, **doc})),
)


def loads_or_refuses(text: str, tmp_path=None) -> None:
    for check_paths in (False, True):
        try:
            parse_draft_config(text, file=None if tmp_path is None else tmp_path / "d.yaml", check_paths=check_paths)
        except DraftConfigError as exc:
            assert exc.issues and all(str(issue) for issue in exc.issues)


@FUZZ
@given(documents)
def test_structured_documents(tmp_path_factory, doc):
    loads_or_refuses(yaml.safe_dump(doc, allow_unicode=True), tmp_path_factory.getbasetemp())


@FUZZ
@given(st.one_of(st.text(max_size=200), st.binary(max_size=200).map(lambda b: b.decode("latin-1"))))
def test_arbitrary_text(text):
    loads_or_refuses(text)


@FUZZ
@given(st.lists(st.sampled_from([
    "num_speculative_tokens: 3\n", "domains:\n", "  a:\n", "    draft: /x\n", "    match: {regex: ['(a+)+$']}\n",
    "    match: {keywords: [&k x]}\n", "default: *k\n", "controller:\n", "  adaptive: false\n", "  probe_k: 2\n",
    "default:\n", "  draft: null\n", "  num_speculative_tokens: 2\n", "- 1\n", "? [a]\n", ": b\n", "!!python/object:os.system ls\n",
    "x: 2024-13-40\n", "\t", "{", "'", "\x00", "%YAML 1.1\n", "--- \n", "...\n", "a: &a [*a]\n",
]), max_size=12).map("".join))
def test_spliced_key_lines(text):
    loads_or_refuses(text)
