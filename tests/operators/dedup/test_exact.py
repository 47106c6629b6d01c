import pyarrow as pa
import xxhash

from operators.dedup.exact import content_hash_hex, content_hashes
from operators.dedup.normalize import NO_NORMALIZATION


def test_equal_after_normalization_hash_equal():
    digests = content_hashes(pa.array(["Hello,  World!", "hello world", "hello there", None]))
    assert digests.type == pa.binary(16)
    values = digests.to_pylist()
    assert values[0] == values[1] == xxhash.xxh3_128_digest(b"hello world")
    assert values[2] != values[0]
    assert values[3] == xxhash.xxh3_128_digest(b"")


def test_hex_and_no_normalization():
    hexes = content_hash_hex(pa.chunked_array([["A b"], ["a b"]]), NO_NORMALIZATION).to_pylist()
    assert hexes == [xxhash.xxh3_128_hexdigest(b"A b"), xxhash.xxh3_128_hexdigest(b"a b")]
