"""The prompts the tests share, and the runs they put them through: PROMPTS for the teacher-forced logit comparison
(varied, each at least 64 tokens); the token feed the streamed-against-resident tests compare (a 40-token prompt,
then 3 decoded tokens); the prompts of the tests that compare runs of one model; greedy text."""

import itertools

import numpy as np

PROMPTS = [
    "The history of the printing press begins in the fifteenth century, when Johannes Gutenberg "
    "combined movable metal type, oil-based ink and a screw press adapted from wine making. Within "
    "fifty years presses had spread to more than two hundred cities across Europe, and the price of "
    "books fell so far that ordinary merchants could own them. Printers became publishers, editors "
    "and booksellers at once, and the first newspapers appeared in the early seventeenth century.",
    "def merge_sort(items):\n    \"\"\"Return a new sorted list.\"\"\"\n    if len(items) <= 1:\n"
    "        return list(items)\n    mid = len(items) // 2\n    left = merge_sort(items[:mid])\n"
    "    right = merge_sort(items[mid:])\n    out = []\n    i = j = 0\n    while i < len(left) and j < len(right):\n"
    "        if left[i] <= right[j]:\n            out.append(left[i]); i += 1\n",
    "Q: A train leaves the station at 3:15 pm travelling at 80 km/h. A second train leaves the same "
    "station at 4:00 pm travelling at 120 km/h on the same track. At what time does the second train "
    "catch up with the first?\nA: Let t be the hours after 4:00 pm. The first train is 60 km ahead, so",
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nWrite a short poem "
    "about the sea at night, with the moon, the tide and a lighthouse keeper who cannot sleep.<|im_end|>\n"
    "<|im_start|>assistant\nThe moon lays silver on the restless tide,\nthe lighthouse keeper "
    "counts the waves that break against the stone, and every hour he climbs the winding stair to trim "
    "the lamp",
    "Recipe for a simple bread: 500 g flour, 350 ml warm water, 10 g salt, 7 g dried yeast. Mix the "
    "flour and yeast, add the water and salt, and knead for ten minutes until smooth. Leave to rise for "
    "an hour, shape into a loaf, rise again for 45 minutes, then bake at 220 degrees for 30 minutes.",
]


FEED_PROMPT = list(range(300, 340))
FEED_DECODE = [7, 11, 13]


def feed_logits(m) -> np.ndarray:
    """Every prompt row's logits, then each decoded token's: F32 [43, n_vocab]."""
    out = [m.eval(FEED_PROMPT, logits_all=True).copy()]
    out += [m.eval([t]).copy() for t in FEED_DECODE]
    return np.concatenate(out)


# the shared prompts of the tests that compare runs of one model: a sentence, token ids, random token ids
CAPITAL = "The capital of France is"
TOKENS_40 = list(range(300, 340))
RANDOM_60 = [int(x) for x in np.random.default_rng(1).integers(0, 49152, 60)]
# the tests that load a family's synthetic GGUF once per changed key or shape, here and in llama.cpp
TOKENS_10 = [1, 450, 937, 17, 210, 339, 90, 12, 300, 77]


def run_prompt(m) -> np.ndarray:
    """TOKENS_40's rows' logits, then six greedy tokens' (each the argmax of the row before): F32 [46, n_vocab]."""
    out = [m.eval(TOKENS_40, logits_all=True).copy()]
    t = int(np.argmax(out[0][-1]))
    for _ in range(6):
        out.append(m.eval([t]).copy())
        t = int(np.argmax(out[-1][-1]))
    return np.concatenate(out)


def greedy(m, prompt, n: int) -> str:
    """n greedy tokens' text (temperature 0) after `prompt`: a text or token ids through create_completion, a list
    of chat messages ({"role": ..., "content": ...}) through create_chat_completion."""
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], dict):
        out = m.create_chat_completion(prompt, temperature=0.0, max_tokens=n)
        return str(out["choices"][0]["message"]["content"])
    return m.create_completion(prompt, max_tokens=n, temperature=0.0)["choices"][0]["text"]


def random_tokens(n: int, seed: int = 1) -> list[int]:
    """n token ids in [3, 1000): a prompt for the small-vocabulary synthetic models."""
    return [int(x) for x in np.random.default_rng(seed).integers(3, 1000, n)]


def greedy_rows(m, prompt: list[int], n_decode: int) -> np.ndarray:
    """The prompt's logits, then n_decode greedy steps' (llama_ref's kv_types: the argmax fed back)."""
    rows = [m.eval(prompt, logits_all=True).copy()]
    for _ in range(n_decode):
        rows.append(m.eval([int(np.argmax(rows[-1][-1]))]).copy())
    return np.concatenate(rows)


def greedy_ids(m, prompt: list[int], n: int) -> list[int]:
    """The first n token ids m.generate gives at temperature 0 after `prompt`."""
    return list(itertools.islice(m.generate(prompt, temp=0.0), n))
