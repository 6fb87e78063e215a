#!/usr/bin/env python3
"""strata tokenize against an independent byte-level BPE written here in plain Python with the
`regex` module (Debian's python3-regex). Trains a tiny BPE (GPT-2's algorithm: count adjacent
pairs inside pre-tokens, merge the most frequent) in two styles, writes each as a Hugging Face
tokenizer.json, and compares Strata's ids and decode with this file's encoder over text with
accents, CJK, emoji, whitespace runs, newlines, digit runs, contractions and special tokens:
  gpt2    ByteLevel pre-tokenizer (use_regex: GPT-2's pattern), merges as "a b" strings,
          <|endoftext|> in the vocabulary and added_tokens, no BOS.
  llama3  Sequence[Split(Llama 3's pattern, Isolated), ByteLevel(use_regex false)], merges as
          [a, b] pairs, ignore_merges, specials at ids 128000.. (so uint32 token files), and a
          TemplateProcessing post-processor prepending <|begin_of_text|> (the default BOS).
  qwen2   an NFC normalizer (the reference: Python's unicodedata), Qwen2's pattern (single
          digits), merges as pairs, specials at 151643.., no BOS.
Usage: bpe_reference_test.py STRATA TOKENIZER_DECODE WORKDIR"""
import collections
import json
import os
import struct
import subprocess
import sys
import unicodedata

import regex

GPT2 = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
LLAMA3 = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
          r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")
QWEN2 = LLAMA3.replace(r"\p{N}{1,3}", r"\p{N}")


def bytes_to_unicode():
    """GPT-2's map (encoder.py), written out from its definition."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs]))


B2U = bytes_to_unicode()
U2B = {u: b for b, u in B2U.items()}


def spell(text):
    return "".join(B2U[b] for b in text.encode("utf-8"))


def pre_tokens(pattern, text):
    """Isolated split: the matches and the (here always empty) gaps between them."""
    out, at = [], 0
    for m in regex.finditer(pattern, text):
        if m.start() > at:
            out.append(text[at:m.start()])
        out.append(m.group())
        at = m.end()
    if at < len(text):
        out.append(text[at:])
    return out


def train(pattern, corpus, merges_wanted):
    words = collections.Counter(tuple(spell(w)) for w in pre_tokens(pattern, corpus))
    merges = []
    for _ in range(merges_wanted):
        pairs = collections.Counter()
        for w, c in words.items():
            for p in zip(w, w[1:]):
                pairs[p] += c
        if not pairs:
            break
        best = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))[0]
        merges.append(best)
        merged = collections.Counter()
        for w, c in words.items():
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and (w[i], w[i + 1]) == best:
                    out.append(w[i] + w[i + 1])
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            merged[tuple(out)] += c
        words = merged
    vocab = {B2U[b]: b for b in range(256)}
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    return vocab, merges


def bpe(word, ranks):
    """GPT-2's bpe(): merge the lowest-ranked adjacent pair until none is left."""
    parts = list(word)
    while len(parts) > 1:
        pairs = [(ranks.get((parts[i], parts[i + 1]), None), i) for i in range(len(parts) - 1)]
        pairs = [p for p in pairs if p[0] is not None]
        if not pairs:
            break
        rank = min(pairs)[0]
        out, i = [], 0
        while i < len(parts):
            if i + 1 < len(parts) and ranks.get((parts[i], parts[i + 1])) == rank:
                out.append(parts[i] + parts[i + 1])
                i += 2
            else:
                out.append(parts[i])
                i += 1
        parts = out
    return parts


class Reference:
    def __init__(self, pattern, vocab, merges, specials, ignore_merges, nfc=False):
        self.pattern, self.vocab, self.specials, self.ignore_merges = pattern, vocab, specials, ignore_merges
        self.nfc = nfc
        self.ranks = {m: r for r, m in enumerate(merges)}
        self.inverse = {i: t for t, i in vocab.items()}
        alternatives = sorted(specials, key=len, reverse=True)  # leftmost, then longest
        self.special_re = regex.compile("|".join(regex.escape(s) for s in alternatives))

    def encode(self, text):
        ids, at = [], 0
        for m in self.special_re.finditer(text):
            ids += self.encode_plain(text[at:m.start()])
            ids.append(self.specials[m.group()])
            at = m.end()
        return ids + self.encode_plain(text[at:])

    def encode_plain(self, text):
        if self.nfc:
            text = unicodedata.normalize("NFC", text)
        ids = []
        for w in pre_tokens(self.pattern, text):
            s = spell(w)
            if self.ignore_merges and s in self.vocab:
                ids.append(self.vocab[s])
            else:
                ids += [self.vocab[p] for p in bpe(s, self.ranks)]
        return ids

    def decode(self, ids):
        specials = {i: s for s, i in self.specials.items()}
        out = b""
        for i in ids:
            out += specials[i].encode() if i in specials else bytes(U2B[c] for c in self.inverse[i])
        return out


CORPUS = """The quick brown fox jumps over the lazy dog. They're here, we've seen it, I'm sure you'll agree.
It's 2026 and the numbers 1234567 and 3.14159 were written 42 times; the the the of of and and.
Café naïve résumé über straße. 日本語のテキストです。中文文本。 Emojis 🙂🙂 👍🏽 are bytes too.
    indented code(x) { return x + 1; }
\tTabs\tand  double  spaces   and\r\nCRLF lines.
""" * 3

TEXTS = [
    "Hello world! The quick brown fox.",
    "They're HERE, we've SEEN it: I'M sure you'll agree, don't you? IT'S 'S 'T",
    "Digits: 1 12 123 1234 12345 1234567890 3.14159 2026-11-28 ٣٤٥",
    "Whitespace   runs\t\t\tand\n\n\nnewlines \n  \n\r\n trailing   ",
    "Accents: café naïve résumé Ünïcödé straße ÀÉÎÕÜ",
    "CJK: 日本語のテキストです。中文文本，한국어 텍스트",
    "Emoji: 🙂🙂🙂 👍🏽 👩‍👩‍👧 🇫🇷 and ✓ ✗",
    "special<|endoftext|>tokens in<|endoftext|><|endoftext|> the middle <|endoftext|>",
    "llama <|begin_of_text|>mixed<|eot_id|>\n<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>",
    " qqq qqq  qqq\nqqq",
    "Decomposed: Cafe\u0301 nai\u0308ve A\u030angstro\u0308m \u1100\u1161\u11a8 precomposed: caf\u00e9",
    "<|im_start|>user\nqwen's turn: 12345<|im_end|>\n",
    "    indented code(x) { return x + 1; }\n",
    "",
]


def write_tokenizer(path, style):
    corpus = CORPUS
    if style == "gpt2":
        vocab, merges = train(GPT2, corpus, 300)
        vocab[spell(" qqq")] = len(vocab)  # unreachable by merges: only ignore_merges finds it
        specials = {"<|endoftext|>": len(vocab)}
        vocab["<|endoftext|>"] = specials["<|endoftext|>"]
        doc = {
            "version": "1.0", "truncation": None, "padding": None,
            "added_tokens": [{"id": i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
                              "normalized": False, "special": True} for s, i in specials.items()],
            "normalizer": None,
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
            "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
            "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                      "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False,
                      "vocab": vocab, "merges": [a + " " + b for a, b in merges]},
        }
        ref = Reference(GPT2, vocab, merges, specials, False)
        bos = None
    elif style == "qwen2":
        vocab, merges = train(QWEN2, corpus, 300)
        specials = {s: 151643 + i for i, s in enumerate(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])}
        doc = {
            "version": "1.0", "truncation": None, "padding": None,
            "added_tokens": [{"id": i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
                              "normalized": False, "special": True} for s, i in specials.items()],
            "normalizer": {"type": "NFC"},
            "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": QWEN2}, "behavior": "Isolated", "invert": False},
                {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]},
            "post_processor": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                               "use_regex": False},
            "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                      "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                      "vocab": vocab, "merges": [[a, b] for a, b in merges]},
        }
        ref = Reference(QWEN2, vocab, merges, specials, False, nfc=True)
        bos = None
    else:
        vocab, merges = train(LLAMA3, corpus, 300)
        vocab[spell(" qqq")] = len(vocab)
        names = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
        specials = {s: 128000 + i for i, s in enumerate(names)}
        specials["<|reserved_special_token_250|>"] = 128255
        doc = {
            "version": "1.0", "truncation": None, "padding": None,
            "added_tokens": [{"id": i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
                              "normalized": False, "special": True} for s, i in specials.items()],
            "normalizer": None,
            "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": LLAMA3}, "behavior": "Isolated", "invert": False},
                {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]},
            "post_processor": {"type": "Sequence", "processors": [
                {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
                {"type": "TemplateProcessing",
                 "single": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
                            {"Sequence": {"id": "A", "type_id": 0}}],
                 "pair": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
                          {"Sequence": {"id": "A", "type_id": 0}},
                          {"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 1}},
                          {"Sequence": {"id": "B", "type_id": 1}}],
                 "special_tokens": {"<|begin_of_text|>": {"id": "<|begin_of_text|>", "ids": [128000],
                                                          "tokens": ["<|begin_of_text|>"]}}}]},
            "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                      "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": True,
                      "vocab": vocab, "merges": [[a, b] for a, b in merges]},
        }
        ref = Reference(LLAMA3, vocab, merges, specials, True)
        bos = 128000
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False)
    return ref, bos


def read_token_file(path):
    with open(path, "rb") as f:
        data = f.read()
    magic, version, n = struct.unpack("<3i", data[:12])
    assert magic == 20240520, (path, magic)
    width = {1: 2, 2: 4}[version]
    assert len(data) == 1024 + width * n, (path, len(data), n)
    return version, list(struct.unpack("<%d%s" % (n, "H" if width == 2 else "I"), data[1024:]))


def refusals(strata, work):
    """The command's refusals name the file and the key, exit non-zero and leave no output."""
    failures = 0
    good = os.path.join(work, "gpt2-tokenizer.json")
    with open(good, encoding="utf-8") as f:
        doc = json.load(f)
    doc["model"]["type"] = "WordPiece"
    wordpiece = os.path.join(work, "wordpiece.json")
    with open(wordpiece, "w", encoding="utf-8") as f:
        json.dump(doc, f)
    src, bad_text = os.path.join(work, "refusal.txt"), os.path.join(work, "latin1.txt")
    with open(src, "w") as f:
        f.write("some text")
    with open(bad_text, "wb") as f:
        f.write("caf\u00e9".encode("latin-1"))
    cases = [
        ([wordpiece, src], ["wordpiece.json", "model.type", "WordPiece"]),
        ([good, src, "--bos"], ["gpt2-tokenizer.json", "has no BOS"]),
        ([good, bad_text], ["not UTF-8 at byte 3"]),
        ([os.path.join(work, "missing.json"), src], ["missing.json", "does not exist"]),
    ]
    for args, words in cases:
        out = os.path.join(work, "refused.bin")
        r = subprocess.run([strata, "tokenize", "--tokenizer", args[0], args[1], out] + args[2:], capture_output=True,
                           text=True)
        if r.returncode == 0 or not all(w in r.stderr for w in words) or os.path.exists(out) \
                or os.path.exists(out + ".tmp"):
            failures += 1
            print("FAIL refusal %s: exit %d, stderr %r, output left: %s" % (args, r.returncode, r.stderr,
                                                                           os.path.exists(out)))
    print("refusals: %d cases" % len(cases))
    return failures


def main():
    strata, decoder, work = sys.argv[1:4]
    os.makedirs(work, exist_ok=True)
    failures = 0
    for style in ("gpt2", "llama3", "qwen2"):
        tok = os.path.join(work, style + "-tokenizer.json")
        ref, bos = write_tokenizer(tok, style)
        for k, text in enumerate(TEXTS + [CORPUS]):
            src, out = os.path.join(work, "%s-%d.txt" % (style, k)), os.path.join(work, "%s-%d.bin" % (style, k))
            with open(src, "w", encoding="utf-8", newline="") as f:
                f.write(text)
            for flags, with_bos in (([], bos is not None), (["--no-bos"], False)):
                subprocess.run([strata, "tokenize", "--tokenizer", tok, src, out] + flags, check=True,
                               stdout=subprocess.DEVNULL)
                version, got = read_token_file(out)
                want = ([bos] if with_bos else []) + ref.encode(text)
                want_version = 1 if style == "gpt2" else 2
                if got != want or version != want_version:
                    failures += 1
                    print("FAIL %s text %d %s: version %d (want %d)\n  strata    %s\n  reference %s\n  text %r" %
                          (style, k, flags, version, want_version, got, want, text))
                    continue
                back = os.path.join(work, "%s-%d.back" % (style, k))
                subprocess.run([decoder, tok, out, back], check=True)
                with open(back, "rb") as f:
                    decoded = f.read()
                if decoded != ref.decode(got) or decoded != ref.decode(want):
                    failures += 1
                    print("FAIL %s text %d decode: %r != %r" % (style, k, decoded, ref.decode(got)))
                prefix = b"<|begin_of_text|>" if with_bos else b""
                if decoded != prefix + (unicodedata.normalize("NFC", text) if ref.nfc else text).encode("utf-8"):
                    failures += 1
                    print("FAIL %s text %d: decode(encode(t)) != t: %r" % (style, k, decoded))
        print("%s: %d texts compared" % (style, len(TEXTS) + 1))
    failures += refusals(strata, work)
    if failures:
        print("%d failures" % failures)
        return 1
    print("strata tokenize agrees with the reference byte-level BPE")
    return 0


if __name__ == "__main__":
    sys.exit(main())
