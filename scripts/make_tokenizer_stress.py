#!/usr/bin/env python3
"""Writes tests/data/tokenizer_stress.json: the stress corpus of python/tests/test_tokenizer_hf.py.

    /usr/bin/python3 scripts/make_tokenizer_stress.py > tests/data/tokenizer_stress.json

Hand-picked strings for each hard case of the three tokenizer families (whitespace runs, newlines
and tabs, NFC and NFD accents, 4-byte UTF-8, CJK, contractions, numbers, long words, punctuation,
mixed scripts, non-breaking and ideographic spaces, control characters), then strings assembled
from the same fragments with a seeded generator, so that the file is reproducible byte for byte.
"""
import json
import random
import unicodedata

HAND = [
    "Hello world", "Hello  world", "Hello   world", " Hello", "  Hello", "Hello ", "Hello  ", "",
    " ", "  ", "\n", "\n\n", "a\n\nb", "a \n b", "\t", "a\tb", "a\t\tb", " \t \n ", "line1\r\nline2",
    "don't", "I'LL", "I'll", "we're", "they've", "she's", "I'm", "he'd", "can't won't shouldn't",
    "'s 't 're 've 'm 'll 'd", "''s", "rock'n'roll", "O'Neil's", "DON'T STOP",
    "1234567890", "3.14159", "1,000,000", "12:30pm", "v2.0.1", "$100.00", "50%", "1st 2nd 3rd 4th",
    "caf\u00e9", unicodedata.normalize("NFD", "caf\u00e9"), "na\u00efve r\u00e9sum\u00e9",
    unicodedata.normalize("NFD", "na\u00efve r\u00e9sum\u00e9"), "\u00c9COLE \u00e9cole", "Stra\u00dfe",
    "\u0130stanbul", "\u039f\u0394\u039f\u03a3 \u03bf\u03b4\u03bf\u03c2", "\u00c5ngstr\u00f6m",
    "\U0001F600", "\U0001F44D\U0001F3FD", "\U0001F468\u200D\U0001F469\u200D\U0001F467", "I \u2764\ufe0f NY",
    "\U0001F1EB\U0001F1F7", "\U00020000\U0002A6D6", "\U0001D400\U0001D401", "\U00010348",
    "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8", "\u4e2d\u6587\u5b57\u7b26", "\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8",
    "\u3053\u3093\u306b\u3061\u306f\u4e16\u754c", "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645",
    "\u041f\u0440\u0438\u0432\u0435\u0442, \u043c\u0438\u0440!", "\u05e9\u05dc\u05d5\u05dd",
    "\u0928\u092e\u0938\u094d\u0924\u0947", "\u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35",
    "a\u00a0b", "a\u00a0\u00a0b", "\u00a0lead", "a\u3000b", "\u3000\u3000x", "a\u2028b", "a\u2029b",
    "a\u0085b", "a\u200bb", "a\u2009b", "a\u202fb", "a\u1680b", "a\x0bb", "a\x0cb", "a\x1cb", "a\x1fb",
    "a\x00b", "a\ufffdb", "\x7f", "a\u00adb", "\ue000private",
    "Hello, world! How are you? I'm fine... Thanks!!!", "(parens) [brackets] {braces} <angles>",
    "\"quoted\" 'single' \u201ccurly\u201d \u2018also\u2019", "a--b \u2014 c \u2013 d", "#hashtag @mention",
    "foo_bar baz-qux", "path/to/file.txt", "https://example.com/a?b=c&d=e#f", "user@example.com",
    "\u00bfQu\u00e9? \u00a1S\u00ed!", "\u2026 \u00b7 \u2022 \u00a7 \u00b6", "~`!@#$%^&*()-_=+[]{}\\|;:'\",.<>/?",
    "supercalifragilisticexpialidocious", "Pneumonoultramicroscopicsilicovolcanoconiosis",
    "a" * 99, "a" * 100, "a" * 101, "\u00e9" * 101, "x" * 250, "ab" * 60,
    "unaffable", "i like strawberries", "UNAFFABLE Strawberries", "lowercase UPPERCASE MiXeD",
    "The quick brown fox jumps over the lazy dog.", "Once upon a time, there was a little girl.",
]

FRAGMENTS = [
    "the", "The", " of", "and", "to", "in", "is", "was", "he", "she", "it's", "don't", "we'll", "I've",
    "they're", "Lily", "Tom", "happy", "played", "garden", "unbelievable", "tokenization", "transformer",
    "attention", "clustered", "0", "7", "42", "2024", "3.5", "1e-3", "100%", ",", ".", "!", "?", ";",
    ":", "...", "--", "(", ")", "\"", "'", "-", "/", "&", "*", "#", "caf\u00e9", "\u00fcber", "na\u00efve",
    unicodedata.normalize("NFD", "\u00e9t\u00e9"), unicodedata.normalize("NFD", "\u00d6sterreich"),
    "Stra\u00dfe", "\u00e7a va", "\u65e5\u672c", "\u4e2d\u6587", "\u6771\u4eac\u90fd", "\ud55c\uae00",
    "\u30ab\u30bf\u30ab\u30ca", "\u043c\u043e\u0441\u043a\u0432\u0430", "\u0391\u03b8\u03ae\u03bd\u03b1",
    "\u0639\u0631\u0628\u064a", "\U0001F600", "\U0001F680", "\U0001F44D", "\U0001F9E0", "\U0001F308",
    "\U00020021", "\u2764\ufe0f", "\u00a0", "\u3000", "\u2009", "\t", "\n", "\n\n", "  ", "   ", " \n",
    "\r\n", "\u2014", "\u201c", "\u201d", "\u00bf", "\u00a1", "\u20ac", "\u00a3", "\u00a5",
]


def assembled(rng):
    n = rng.randint(3, 60)
    out = []
    for _ in range(n):
        out.append(rng.choice(FRAGMENTS))
        r = rng.random()
        out.append(" " if r < 0.6 else "" if r < 0.8 else rng.choice([" ", "  ", "\n", "\t", "\u00a0", "\u3000"]))
    return "".join(out)


def main():
    rng = random.Random(20241127)
    strings = list(HAND)
    while len(strings) < 260 or sum(len(s) for s in strings) < 24000:
        strings.append(assembled(rng))
    json.dump({"about": "stress corpus of python/tests/test_tokenizer_hf.py (scripts/make_tokenizer_stress.py)",
               "strings": strings}, __import__("sys").stdout, ensure_ascii=True, indent=0)
    print()


if __name__ == "__main__":
    main()
