"""The matcher's output is pinned to ``MATCHER_VERSION``: release gates reuse a recorded clean eval-set check only when
it names the same matcher version, so a change to the normalization or the n-gram hashing that is not given a new
version would let a check made by the old code stand for the new one."""

from __future__ import annotations

import hashlib

import numpy as np
import pyarrow as pa

from operators.decontam import ngrams
from operators.decontam.views import match_rows

# MATCHER_VERSION -> sha256 of what the matcher makes of TEXTS (normalized texts, 13-gram and 3-gram hashes, owners,
# and an index of ITEMS' lookup of them: counts and first items)
PINNED = {1: "43e565d07fa65159bfabfbc1e0d8d41be5fa9892c21634f3d577bea190a5a33f",
          2: "ad848c8bdf6d115b74eb16d57e8835adf10ec3607773a0c31b2a5eb581946e61"}
# ... of rows without conversation columns only (version 1's digest above is this part alone). Recomputed when
# match_rows of a text-only table joined the recipe (the path check.py and op.py take for text tables): the same value
# from the tree before the views' floor (3d8bb43~1), whose text matching is version 1's
PINNED_TEXT = {1: "43e565d07fa65159bfabfbc1e0d8d41be5fa9892c21634f3d577bea190a5a33f",
               2: "43e565d07fa65159bfabfbc1e0d8d41be5fa9892c21634f3d577bea190a5a33f"}
TEXTS = ["The Quick, Brown fox -- jumps over the lazy dog; again & again!",
         "ＦＵＬＬＷＩＤＴＨ Ｔｅｘｔ and «quotes» — em-dash, Ça va? Straße costs 5€ ± 2 ©2024 ①", "short one", "", None,
         "tabs\tand\nnewlines  and   spaces " * 3]
ITEMS = ["newlines and spaces tabs and newlines and spaces tabs and newlines and spaces extra words here",
         "the quick brown fox jumps over the lazy dog again and again", "short one",
         "TABS AND NEWLINES AND SPACES TABS AND NEWLINES AND SPACES TABS AND NEWLINES",
         "Capital of France?\nParis", "中国的首都是哪座城市？\n北京"]


def _matcher_digest(*, views: bool = True) -> str:
    texts = pa.array(TEXTS, pa.string())
    digest = hashlib.sha256()
    for text in ngrams.normalize_for_ngrams(texts).to_pylist():
        digest.update((text or "").encode() + b"\x00")
    for n in (ngrams.DEFAULT_NGRAM, 3):
        hashes, owners = ngrams.NgramHasher(n)(texts)
        digest.update(np.ascontiguousarray(hashes, dtype=np.uint64).tobytes())
        digest.update(np.ascontiguousarray(owners, dtype=np.int64).tobytes())
        # the index's lookup: which texts match, how many n-grams, and which item is a text's first match (the ref
        # a release's lineage names); items overlap the texts, each other, and one is a short text
        index = ngrams.NgramIndex.build(pa.array(ITEMS, pa.string()), [f"set@1:{i}" for i in range(len(ITEMS))],
                                        ngram=n)
        matches = index.match(texts)
        digest.update(np.ascontiguousarray(matches.counts, dtype=np.int64).tobytes())
        digest.update(np.ascontiguousarray(matches.first_item, dtype=np.int64).tobytes())
        # the path a table without conversation columns takes in a check and in decontaminate (check.py, op.py)
        rows = match_rows(index, pa.table({"text": texts}))
        digest.update(np.ascontiguousarray(rows.counts, dtype=np.int64).tobytes())
        digest.update(np.ascontiguousarray(rows.first_item, dtype=np.int64).tobytes())
        if views:  # which texts of a conversation row are matched (version 2: the rendering and its views)
            rows = match_rows(index, _conversations())
            digest.update(np.ascontiguousarray(rows.counts, dtype=np.int64).tobytes())
            digest.update(np.ascontiguousarray(rows.first_item, dtype=np.int64).tobytes())
    return digest.hexdigest()


def _conversations() -> pa.Table:
    """Chat, preference and trajectory rows whose turns split ITEMS between a question and an answer (``text``: a
    rendering), each matched by one view family at 13-grams: a question with its answer (row 0), question turns with
    answers between them (MT-Bench: row 3, its question turns alone), a preference's prompt with its chosen reply
    (row 4), a trajectory step (row 2); turns equal to the 2-word item (rows 1 and 5: below MIN_VIEW_WORDS); a pair
    of exactly MIN_VIEW_WORDS words (row 6: a higher floor loses it); a Chinese pair of 2 words (row 7: a script without
    spaces is held to the floor in letters)."""
    from datahub.kinds.posttraining import MESSAGES, STEPS

    def chat(*turns):
        return [{"role": role, "content": content, "name": None, "tool_calls": None, "tool_call_id": None}
                for role, content in turns]

    messages = [chat(("system", "be brief"), ("user", "The quick brown fox"), ("assistant", "jumps over the lazy dog"),
                     ("user", "again and again")),
                chat(("user", "short"), ("assistant", "one")), None,
                chat(("user", "the quick brown fox jumps"), ("assistant", "sure, noted"),
                     ("user", "over the lazy dog again and again"), ("assistant", "fine")),
                None,
                chat(("user", "say it"), ("assistant", "Short one!"), ("user", "and once more, please"),
                     ("assistant", "short one")),
                chat(("user", "Capital of France?"), ("assistant", "Paris")),
                chat(("user", "中国的首都是哪座城市？"), ("assistant", "北京"))]
    steps = [None, None, [{"observation": "tabs and newlines", "action": "and spaces", "tool_call": None,
                           "tool_result": None, "reward": None, "done": None}], None, None, None, None, None]
    prompt = [None] * 4 + [chat(("user", "TABS AND NEWLINES AND SPACES"))] + [None] * 3
    chosen = [None] * 4 + [chat(("assistant", "TABS AND NEWLINES AND SPACES TABS AND NEWLINES"))] + [None] * 3
    rejected = [None] * 4 + [chat(("assistant", "no idea, sorry"))] + [None] * 3
    return pa.table({"text": pa.array(["<|user|> x", "<|user|> y", "<|step 0|> z", "<|user|> w", "<|prompt|> v",
                                       "<|user|> u", "<|user|> t", "<|user|> s"], pa.string()),
                     "messages": pa.array(messages, MESSAGES), "steps": pa.array(steps, STEPS),
                     "prompt": pa.array(prompt, MESSAGES), "chosen": pa.array(chosen, MESSAGES),
                     "rejected": pa.array(rejected, MESSAGES)})


def test_the_matchers_output_is_the_one_pinned_to_its_version():
    found = _matcher_digest()
    assert PINNED.get(ngrams.MATCHER_VERSION) == found, (
        f"the eval-set matcher's output changed ({found}) but MATCHER_VERSION is still {ngrams.MATCHER_VERSION}: "
        "bump operators/decontam/ngrams.py MATCHER_VERSION (and Decontaminate.version in op.py), then pin the new "
        "digest here under the new version")


def test_versions_said_to_match_text_tables_as_today_have_todays_text_digest():
    """``SAME_ON_TEXT_TABLES`` lets a gate take an older matcher's check of a table without conversation columns:
    only sound while such rows are matched exactly as that version matched them."""
    assert PINNED_TEXT.get(ngrams.MATCHER_VERSION) == _matcher_digest(views=False)
    for version in ngrams.SAME_ON_TEXT_TABLES:
        assert PINNED_TEXT[version] == PINNED_TEXT[ngrams.MATCHER_VERSION], version
