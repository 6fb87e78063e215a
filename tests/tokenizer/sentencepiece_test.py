#!/usr/bin/env python3
"""strata tokenize against SentencePiece's own Python binding (Debian's python3-sentencepiece):
trains tiny BPE and unigram models here (byte_fallback on, so characters the training text
lacks become bytes), then compares Strata's ids with sp.encode and Strata's decode with
sp.decode over text with accents, CJK, emoji, whitespace runs, newlines and digits, with the
BOS (on by default for SentencePiece) and with --no-bos.
Usage: sentencepiece_test.py STRATA TOKENIZER_DECODE WORKDIR"""
import os
import struct
import subprocess
import sys

import sentencepiece as spm

CORPUS = """The quick brown fox jumps over the lazy dog. They're here, we've seen it, I'm sure you'll agree.
It's 2026 and the numbers 1234567 and 3.14159 were written 42 times; the the the of of and and.
Café naïve résumé über straße. 日本語のテキストです。中文文本。
    indented code(x) { return x + 1; }
Tabs\tand  double  spaces   and more lines of ordinary English text for the model to learn from.
A second paragraph, with other words: models, tokens, bytes, pieces, merges, vocabulary.
"""

TEXTS = [
    "Hello world! The quick brown fox.",
    "They're HERE, we've SEEN it: I'M sure you'll agree.",
    "Digits: 1 12 123 1234 12345 1234567890 3.14159 2026-11-28",
    "Whitespace   runs\t\t\tand\n\n\nnewlines \n  \n trailing   ",
    "Accents: café naïve résumé Ünïcödé straße",
    "CJK: 日本語のテキストです。中文文本，한국어 텍스트",
    "Emoji (not in training, so bytes): 🙂🙂 👍🏽 ✓",
    CORPUS,
]


def read_token_file(path):
    with open(path, "rb") as f:
        data = f.read()
    magic, version, n = struct.unpack("<3i", data[:12])
    assert magic == 20240520 and version == 1 and len(data) == 1024 + 2 * n, (path, magic, version, n)
    return list(struct.unpack("<%dH" % n, data[1024:]))


def main():
    strata, decoder, work = sys.argv[1:4]
    os.makedirs(work, exist_ok=True)
    corpus = os.path.join(work, "corpus.txt")
    with open(corpus, "w", encoding="utf-8") as f:
        f.write(CORPUS * 4)
    failures = 0
    for model_type in ("bpe", "unigram"):
        prefix = os.path.join(work, model_type)
        spm.SentencePieceTrainer.train(input=corpus, model_prefix=prefix, vocab_size=400, model_type=model_type,
                                       byte_fallback=True, character_coverage=1.0, hard_vocab_limit=False,
                                       minloglevel=2)
        model = prefix + ".model"
        sp = spm.SentencePieceProcessor(model_file=model)
        for k, text in enumerate(TEXTS):
            src, out = os.path.join(work, "%s-%d.txt" % (model_type, k)), os.path.join(work, "%s-%d.bin" % (model_type, k))
            with open(src, "w", encoding="utf-8", newline="") as f:
                f.write(text)
            for flags, bos in (([], [sp.bos_id()]), (["--no-bos"], [])):
                subprocess.run([strata, "tokenize", "--tokenizer", model, src, out] + flags, check=True,
                               stdout=subprocess.DEVNULL)
                got = read_token_file(out)
                want = bos + sp.encode(text)
                if got != want:
                    failures += 1
                    print("FAIL %s text %d %s:\n  strata      %s\n  sentencepiece %s" % (model_type, k, flags, got,
                                                                                        want))
                    continue
                back = os.path.join(work, "%s-%d.back" % (model_type, k))
                subprocess.run([decoder, model, out, back], check=True)
                with open(back, "rb") as f:
                    decoded = f.read().decode("utf-8")
                if decoded != sp.decode(want):
                    failures += 1
                    print("FAIL %s text %d decode: %r != %r" % (model_type, k, decoded, sp.decode(want)))
        print("%s: %d texts compared" % (model_type, len(TEXTS)))
    if failures:
        print("%d failures" % failures)
        return 1
    print("strata tokenize agrees with SentencePiece")
    return 0


if __name__ == "__main__":
    sys.exit(main())
