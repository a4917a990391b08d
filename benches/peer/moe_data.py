"""The MoE training example's data draw (`src/moe/data.rs`) in pure Python, for the PyTorch peer
(`moe_train_torch.py`) and its check (`check_moe_data.py`).

Byte tokens. The last 1/20 of the text is held out. A training window of micro-batch `micro` of
step `step` starts, for row `row`, at

    base  = mix(seed ^ mix((step << 20) ^ micro))
    start = mix(base ^ row) % (len(train_text) - seq_len - 1)

and held-out batch `index` at `mix(mix(0xe7a1 ^ index) ^ row) % (len(held_out) - seq_len - 1)`,
`mix` being SplitMix64's finaliser on wrapping u64 arithmetic. Without a data file the run trains
on the same built-in deterministic corpus (`Corpus::built_in`, 4 MiB).
"""

MASK64 = (1 << 64) - 1
# The last 1 / HOLDOUT of the text is held out.
HOLDOUT = 20
# Bytes of the built-in corpus (`BUILT_IN_CORPUS` of `src/moe/command.rs`).
BUILT_IN_CORPUS = 4 << 20


def mix(z):
    """SplitMix64: `data.rs`'s stateless mix, u64 wrapping arithmetic."""
    z = (z + 0x9E3779B97F4A7C15) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def train_draw(seed, step, micro, row):
    """The raw u64 drawn for a training window (before `% positions`)."""
    base = mix((seed & MASK64) ^ mix(((step << 20) & MASK64) ^ micro))
    return mix(base ^ row)


def eval_draw(index, row):
    """The raw u64 drawn for a held-out window (the same for every seed)."""
    return mix(mix(0xE7A1 ^ index) ^ row)


def split(data):
    """`(training text, held-out text)`: the last `len // 20` bytes are held out."""
    cut = len(data) - len(data) // HOLDOUT
    return data[:cut], data[cut:]


def positions(text_len, seq_len):
    """How many window starts a split has (`windows` in `data.rs`)."""
    return text_len - seq_len - 1


def train_starts(seed, step, micro, rows, seq_len, text_len):
    n = positions(text_len, seq_len)
    return [train_draw(seed, step, micro, r) % n for r in range(rows)]


def eval_starts(index, rows, seq_len, text_len):
    n = positions(text_len, seq_len)
    return [eval_draw(index, r) % n for r in range(rows)]


def check_fits(data_len, seq_len, source):
    """Both splits hold a window of `seq_len + 1` bytes (`Corpus::check_fits`)."""
    need = (seq_len + 2) * HOLDOUT
    if data_len < need:
        raise SystemExit(
            f"data {source}: {data_len} bytes: must hold at least {need} bytes for seq_len "
            f"{seq_len} (training and held-out windows)"
        )


class _Rng:
    """`data.rs`'s sequential generator over `mix`."""

    def __init__(self, state):
        self.state = state

    def below(self, n):
        self.state = (self.state + 1) & MASK64
        return mix(self.state) % n

    def pick(self, words):
        return words[self.below(len(words))]


def built_in(length=BUILT_IN_CORPUS):
    """`Corpus::built_in(length)`: the same bytes (sentences, sums, counting), in the same order
    of draws (Rust evaluates `format!` arguments and tuples left to right)."""
    names = ["Ada", "Brook", "Cyrus", "Dana", "Emil", "Farah", "Goran", "Hana", "Ivo", "Jun"]
    adjectives = ["small", "bright", "quiet", "heavy", "rapid", "gentle", "narrow", "ancient"]
    nouns = ["river", "engine", "garden", "signal", "bridge", "lantern", "market", "tensor"]
    verbs = [
        ("repairs", "repaired"), ("watches", "watched"), ("paints", "painted"),
        ("measures", "measured"), ("follows", "followed"), ("builds", "built"),
        ("carries", "carried"), ("finds", "found"),
    ]
    places = ["near the hill", "by the sea", "in the old town", "under the bridge", "at dawn"]
    rng = _Rng(0x5EED)
    parts, size = [], 0
    while size < length:
        kind = rng.below(4)
        if kind in (0, 1):
            present, past = verbs[rng.below(len(verbs))]
            verb = present if rng.below(2) == 0 else past
            name = rng.pick(names)
            adjective = rng.pick(adjectives)
            noun = rng.pick(nouns)
            place = rng.pick(places)
            sentence = f"{name} {verb} the {adjective} {noun} {place}."
        elif kind == 2:
            a = rng.below(50)
            b = rng.below(50)
            sentence = f"{a} plus {b} is {a + b}."
        else:
            start = rng.below(90)
            step = 1 + rng.below(4)
            sentence = f"count by {step}: " + ", ".join(str(start + i * step) for i in range(5)) + "."
        sentence += "\n" if rng.below(6) == 0 else " "
        parts.append(sentence)
        size += len(sentence)  # ASCII: characters are bytes
    return "".join(parts).encode("ascii")


def load(path):
    """The bytes of a UTF-8 text file (as `Corpus::from_file`), or the built-in corpus."""
    if path is None:
        return built_in(), "built-in"
    data = open(path, "rb").read()
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SystemExit(f"{path}: not UTF-8 text: {e}")
    return data, path
