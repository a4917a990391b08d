"""Checks `moe_data.py` (the PyTorch peer's data draw) against values computed by the Rust source
of `src/moe/data.rs` (its `mix`, `Corpus::batch`, `Corpus::eval_batch` and `Corpus::built_in`
compiled on their own, unchanged): window draws for several (seed, step, micro-batch, row), the
held-out draws, SplitMix64's first outputs, and the built-in corpus's length, FNV-1a hash and
first bytes. Pure Python, no torch:

    python3 benches/peer/check_moe_data.py
"""
import os
import sys

sys.dont_write_bytecode = True  # no __pycache__ beside the scripts
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import moe_data  # noqa: E402

# (seed, step, micro, row) -> the u64 that `Corpus::batch` reduces modulo the positions, and
# that u64 % 3_985_000.
TRAIN = [
    ((42, 0, 0, 0), 13001546778580674847, 1149847),
    ((42, 0, 0, 1), 13785976619380384021, 2614021),
    ((42, 1, 0, 0), 16714504002852658707, 2608707),
    ((42, 5, 1, 7), 14685618165151239247, 3954247),
    ((7, 299, 1, 15), 11131414640514522160, 592160),
    ((7, 1999, 0, 31), 15495342927928480375, 1155375),
    ((2**64 - 1, 123456, 3, 2), 2755575961018120188, 3430188),
]
# (index, row) -> the u64 of `Corpus::eval_batch`.
EVAL = [
    ((0, 0), 6182527408381526478),
    ((0, 1), 5822166813107214772),
    ((3, 5), 6844831420536456109),
    ((7, 15), 16887865048032903392),
]
BUILT_IN_LEN = 4194340
BUILT_IN_FNV1A = 0x5A7F408FA7818FF1
BUILT_IN_HEAD = (
    "9 plus 15 is 24. count by 4: 76, 80, 84, 88, 92.\n"
    "Ivo built the narrow lantern in the old town. Ada paints the ancient garden in the old town."
)


def fnv1a(data):
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & moe_data.MASK64
    return h


def main():
    failures = 0

    def expect(what, got, want):
        nonlocal failures
        if got != want:
            failures += 1
            print(f"FAIL {what}: got {got}, want {want}")

    expect("mix(0)", moe_data.mix(0), 0xE220A8397B1DCDAF)
    expect("mix(gamma)", moe_data.mix(0x9E3779B97F4A7C15), 0x6E789E6AA1B965F4)
    for (seed, step, micro, row), draw, start in TRAIN:
        got = moe_data.train_draw(seed, step, micro, row)
        expect(f"train draw {(seed, step, micro, row)}", got, draw)
        # positions = 3_985_000 is a text of 3_985_000 + seq_len + 1 bytes.
        starts = moe_data.train_starts(seed, step, micro, row + 1, 64, 3_985_000 + 64 + 1)
        expect(f"train start {(seed, step, micro, row)}", starts[row], start)
    for (index, row), draw in EVAL:
        expect(f"eval draw {(index, row)}", moe_data.eval_draw(index, row), draw)
    text = moe_data.built_in()
    expect("built-in length", len(text), BUILT_IN_LEN)
    expect("built-in head", text[: len(BUILT_IN_HEAD)].decode(), BUILT_IN_HEAD)
    expect("built-in FNV-1a", fnv1a(text), BUILT_IN_FNV1A)
    train, held = moe_data.split(text)
    expect("split", (len(train), len(held)), (BUILT_IN_LEN - BUILT_IN_LEN // 20, BUILT_IN_LEN // 20))
    checks = 2 + 2 * len(TRAIN) + len(EVAL) + 4
    print(f"{checks - failures} passed, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
