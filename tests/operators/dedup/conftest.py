import random

import pytest


def make_corpus(n_originals: int, *, seed: int = 0, words: int = 120, vocabulary: int = 3000) -> list[str]:
    """Random documents over a Zipf-ish vocabulary: unrelated pairs share almost no 5-grams."""
    rng = random.Random(seed)
    vocab = [f"w{i}" for i in range(vocabulary)]
    weights = [1 / (i + 1) for i in range(vocabulary)]
    return [" ".join(rng.choices(vocab, weights, k=words)) for _ in range(n_originals)]


def edit_words(text: str, rate: float, rng: random.Random) -> str:
    out = []
    for word in text.split():
        if rng.random() < rate:
            op = rng.randrange(3)
            if op == 0:
                out.append("x" + word)
            elif op == 2:
                out.extend([word, "ins"])
        else:
            out.append(word)
    return " ".join(out)


@pytest.fixture
def corpus():
    return make_corpus
