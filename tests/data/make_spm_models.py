"""Regenerates the two small SentencePiece models the tokenizer tests use:

* ``spm-bpe.model``: a BPE model trained like Llama's, Mistral's and Gemma's tokenizers are
  (byte fallback, split digits, whitespace-only pieces, identity normalization, "▁" dummy prefix);
* ``spm-unigram.model``: a unigram model trained Gemma-style: <pad> <eos> <bos> <unk> first, no
  dummy prefix, turn markers as control symbols, whitespace runs as user-defined symbols.

Both learn from a multilingual text generated here from a fixed seed, so that a rerun with the
same sentencepiece (0.2.3) gives the same files::

    pip install sentencepiece==0.2.3
    python3 tests/data/make_spm_models.py

The tests read the models without sentencepiece (tests/api/test_tokenizer.py, read_spm_model).
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

SEED_TEXT = """\
The quick brown fox jumps over the lazy dog while the farmer watches from the barn.
It was the best of times, it was the worst of times, it was the age of wisdom.
Machine learning models are trained on large amounts of text collected from many sources.
Please remember to save your work before closing the application; unsaved changes will be lost.
She said that they'd arrive at 7:30 in the evening, but the train was delayed by forty minutes.
The committee's report, published on 12 March 2021, recommends three major changes.
Don't worry about the details yet: we'll figure them out together tomorrow morning.
In 1969, astronauts landed on the Moon and returned safely to Earth after eight days.
Der schnelle braune Fuchs springt über den faulen Hund, und die Katze schläft im Garten.
Ich habe gestern ein neues Buch gekauft, aber ich hatte noch keine Zeit, es zu lesen.
Die Universität liegt am Rande der Stadt, nicht weit vom großen Fluss entfernt.
Le renard brun rapide saute par-dessus le chien paresseux pendant que l'enfant regarde.
Nous avons visité le musée du Louvre et nous avons beaucoup aimé les peintures françaises.
C'est une belle journée pour se promener au bord de la mer avec des amis.
El rápido zorro marrón salta sobre el perro perezoso mientras los niños juegan en el parque.
¿Dónde está la biblioteca? Necesito encontrar un libro sobre la historia de España.
Mañana vamos a cocinar una paella con mariscos, arroz y azafrán para toda la familia.
A rápida raposa marrom pula sobre o cão preguiçoso, e a criança sorri na janela.
Il veloce gatto nero dorme sul divano mentre fuori piove da tutta la giornata.
De snelle bruine vos springt over de luie hond en de kinderen lachen hardop.
Szybki brązowy lis przeskakuje nad leniwym psem, a dzieci bawią się w ogrodzie.
Zażółć gęślą jaźń, powiedział nauczyciel, pisząc na tablicy kredą.
Hızlı kahverengi tilki tembel köpeğin üzerinden atlar ve çocuklar bahçede oynar.
İstanbul'da yaşayan öğrenciler üniversiteye her sabah vapurla gidiyorlar.
Быстрая коричневая лиса прыгает через ленивую собаку, а дети смеются во дворе.
Вчера мы ходили в театр и смотрели новую постановку по пьесе Чехова.
Москва является столицей России и одним из крупнейших городов Европы.
Съешь же ещё этих мягких французских булок, да выпей чаю.
Η γρήγορη καφέ αλεπού πηδά πάνω από τον τεμπέλη σκύλο στην αυλή του σπιτιού.
Η Αθήνα είναι η πρωτεύουσα της Ελλάδας και έχει μακρά ιστορία.
השועל החום המהיר קופץ מעל הכלב העצלן והילדים צוחקים בחצר.
ירושלים היא עיר עתיקה עם היסטוריה ארוכה ומרתקת.
الثعلب البني السريع يقفز فوق الكلب الكسول والأطفال يلعبون في الحديقة.
اللغة العربية جميلة جدا وهي من أقدم اللغات في العالم.
तेज़ भूरी लोमड़ी आलसी कुत्ते के ऊपर कूदती है और बच्चे बगीचे में खेलते हैं।
भारत एक विशाल देश है जहाँ अनेक भाषाएँ बोली जाती हैं।
জাপানের রাজধানী টোকিও একটি বিশাল শহর এবং সেখানে অনেক মানুষ বাস করে।
สุนัขจิ้งจอกสีน้ำตาลกระโดดข้ามสุนัขขี้เกียจ และเด็กๆ เล่นอยู่ในสวน
Con cáo nâu nhanh nhẹn nhảy qua con chó lười biếng trong khi trẻ em chơi đùa.
Hà Nội là thủ đô của Việt Nam và có lịch sử hơn một nghìn năm.
敏捷的棕色狐狸跳过了懒惰的狗，孩子们在花园里玩耍。
北京是中国的首都，也是一个有着悠久历史的城市。
我们明天早上八点在学校门口见面，然后一起去图书馆学习。
机器学习模型需要大量的数据进行训练，才能得到好的结果。
素早い茶色の狐が怠け者の犬を飛び越え、子供たちは庭で遊んでいます。
東京は日本の首都であり、世界で最も人口の多い都市の一つです。
私は毎朝コーヒーを飲みながら新聞を読みます。
ひらがなとカタカナと漢字を使って日本語の文章を書きます。
빠른 갈색 여우가 게으른 개를 뛰어넘고 아이들은 정원에서 놀고 있습니다.
서울은 대한민국의 수도이며 많은 사람들이 살고 있습니다.
저는 매일 아침 커피를 마시면서 신문을 읽습니다.
Suomen kieli on kaunis, ja talvella järvet jäätyvät kokonaan.
Den snabba bruna räven hoppar över den lata hunden medan barnen leker.
Rychlá hnědá liška skáče přes líného psa a děti se smějí na zahradě.
Kiswahili ni lugha inayozungumzwa na watu wengi katika Afrika Mashariki.
"""

SEED_CODE = """\
def fibonacci(n: int) -> int:
    if n < 2:
        return n
    return fibonacci(n - 1) + fibonacci(n - 2)
for i in range(10):
    print(f"value {i}: {fibonacci(i)}")
class Point:
    def __init__(self, x, y):
        self.x, self.y = x, y
import numpy as np
arr = np.zeros((3, 4), dtype=np.float32)
#include <stdio.h>
int main(void) {
    printf("Hello, %s!\\n", "world");
    return 0;
}
const add = (a, b) => a + b;
console.log(`sum: ${add(1, 2)}`);
SELECT id, name FROM users WHERE age >= 18 ORDER BY name;
{"name": "example", "values": [1, 2, 3], "enabled": true}
<div class="container"><p>Hello</p></div>
fn main() { let v: Vec<i32> = (0..10).collect(); }
"""


def training_lines(n_lines: int = 12000, seed: int = 1234) -> list[str]:
    """Deterministic training text: the seed sentences, their words reshuffled and recombined,
    with numbers, punctuation and runs of spaces and tabs mixed in."""
    rng = random.Random(seed)
    prose = SEED_TEXT.splitlines()
    code = SEED_CODE.splitlines()
    words = [w for line in prose for w in line.split()]
    lines = list(prose) * 4 + list(code) * 6

    def blend(a: str, b: str) -> str:
        return a[: rng.randint(1, max(1, len(a) - 1))] + b[rng.randint(0, len(b) - 1) :]

    while len(lines) < n_lines:
        kind = rng.random()
        if kind < 0.35:
            line = " ".join(rng.choice(prose) for _ in range(rng.randint(1, 3)))
        elif kind < 0.65:
            line = " ".join(rng.choice(words) for _ in range(rng.randint(3, 14)))
        elif kind < 0.8:
            indent = rng.choice(["", "    ", "        ", "\t", "\t\t", "  "])
            line = indent + rng.choice(code).strip()
        elif kind < 0.9:
            nums = [str(rng.randint(0, 10 ** rng.randint(1, 7))) for _ in range(rng.randint(1, 5))]
            line = rng.choice(prose).rstrip(".") + " " + ", ".join(nums) + "."
        elif kind < 0.93:
            gap = " " * rng.randint(2, 8)
            line = gap.join(rng.choice(words) for _ in range(rng.randint(2, 6)))
        else:
            # made-up words: the head of one word joined to the tail of another
            line = " ".join(blend(rng.choice(words), rng.choice(words)) for _ in range(rng.randint(4, 12)))
        lines.append(line)
    return lines


COMMON = dict(
    character_coverage=0.9995,
    byte_fallback=True,
    split_digits=True,
    allow_whitespace_only_pieces=True,
    remove_extra_whitespaces=False,
    normalization_rule_name="identity",
    num_threads=1,
    max_sentence_length=100000,
    minloglevel=2,
)


def main() -> int:
    import os

    import sentencepiece as spm

    os.chdir(HERE)  # the models record their input and output paths: keep them relative
    text = Path("spm-train.txt.tmp")
    text.write_text("\n".join(training_lines()) + "\n", encoding="utf-8")
    try:
        # Llama / Mistral style
        spm.SentencePieceTrainer.train(
            input=str(text),
            model_prefix="spm-bpe",
            model_type="bpe",
            vocab_size=5000,
            unk_id=0,
            bos_id=1,
            eos_id=2,
            pad_id=-1,
            add_dummy_prefix=True,
            control_symbols=["[INST]", "[/INST]"],
            **COMMON,
        )
        # Gemma style
        spm.SentencePieceTrainer.train(
            input=str(text),
            model_prefix="spm-unigram",
            model_type="unigram",
            vocab_size=4000,
            pad_id=0,
            eos_id=1,
            bos_id=2,
            unk_id=3,
            add_dummy_prefix=False,
            pad_piece="<pad>",
            eos_piece="<eos>",
            bos_piece="<bos>",
            unk_piece="<unk>",
            control_symbols=["<mask>", "[@BOS@]", "<unused0>", "<unused1>", "<start_of_turn>", "<end_of_turn>"],
            user_defined_symbols=["\u2581\u2581", "\u2581\u2581\u2581\u2581", "\t\t", "<table>", "<h1>"],
            **COMMON,
        )
    finally:
        text.unlink()
    for name in ("spm-bpe", "spm-unigram"):
        Path(f"{name}.vocab").unlink()
        print(name, Path(f"{name}.model").stat().st_size, "bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
