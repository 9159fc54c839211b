//! Compact JSON in one pass: a tool's raw bytes validated and rewritten as the compact UTF-8
//! text the record holds, byte for byte what serde_json writes for the value it would parse,
//! without building the value. The same pass can find the value a JSON Pointer selects (and
//! the items of that value, for an array), so the projection cuts the agent's result out of
//! the text without reading it again.
//!
//! The pass is iterative (an explicit stack, no recursion). Whenever the text holds something
//! whose rendering this pass does not reproduce itself (an object with a repeated key, nesting
//! serde_json refuses, a string escape it would reject), [`compact`] gives up with `None` and
//! the caller takes the parse-and-serialize path, so the result never differs from serde_json's.

use std::ops::Range;

/// serde_json refuses nesting this deep (its recursion limit), so the pass stops there too.
const SERDE_DEPTH_LIMIT: usize = 128;
/// An object with more keys than this is left to serde_json: repeated keys are found by
/// comparing each key with the earlier ones.
const MAX_KEYS_CHECKED: usize = 64;

/// Bytes a string's plain run stops at: the quote, the backslash and the control characters
/// (which serde_json refuses raw).
const STOPS: [bool; 256] = {
    let mut t = [false; 256];
    let mut b = 0;
    while b < 0x20 {
        t[b] = true;
        b += 1;
    }
    t[b'"' as usize] = true;
    t[b'\\' as usize] = true;
    t
};

/// A JSON text in compact form, as serde_json serializes its value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Compact {
    /// The compact text: no whitespace, strings with non-ASCII unescaped and only `"`, `\` and
    /// control characters escaped, numbers as serde_json renders them.
    pub json: String,
    /// How deeply arrays and objects nest (the measure of [`crate::body::json_depth`]).
    pub depth: usize,
    /// What the [`Select`] given to [`compact_selecting`] selects, if it resolves.
    pub selected: Option<Selected>,
}

/// A JSON Pointer, split into its tokens once (at config load), for [`compact_selecting`];
/// `keep` is how many items of a selected array to give the ranges of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Select {
    tokens: Vec<Token>,
    keep: usize,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Token {
    /// The member name it selects in an object (`~1` and `~0` decoded).
    key: String,
    /// The index it selects in an array, when it is one as serde_json reads it: decimal, no
    /// sign, no leading zero.
    index: Option<usize>,
}

impl Select {
    /// `pointer` resolved as `serde_json::Value::pointer` resolves it; `None` when it is not a
    /// pointer (neither empty nor starting with `/`).
    pub fn new(pointer: &str, keep: usize) -> Option<Select> {
        let tokens = if pointer.is_empty() {
            Vec::new()
        } else {
            pointer
                .strip_prefix('/')?
                .split('/')
                .map(|t| {
                    let key = t.replace("~1", "/").replace("~0", "~");
                    let index = (!(t.starts_with('+') || (t.starts_with('0') && t.len() != 1)))
                        .then(|| t.parse().ok())
                        .flatten();
                    Token { key, index }
                })
                .collect()
        };
        Some(Select { tokens, keep })
    }
}

/// Where the selected value is in [`Compact::json`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selected {
    pub range: Range<usize>,
    /// For an array: how many items it has.
    pub total: usize,
    /// For an array: the ranges of its first `keep` items.
    pub items: Vec<Range<usize>>,
}

enum Frame {
    /// An array, and the index of the item being read.
    Array(usize),
    /// An object, and where its keys' ranges start in the key list.
    Object(usize),
}

/// Where a pass is in its search for the selected value.
struct Search<'s> {
    select: &'s Select,
    /// How many of the open containers (from the outermost) are on the pointer's path.
    on_path: usize,
    /// Where the selected value starts, once it has.
    start: Option<usize>,
    /// Whether the selected value is an array, and where its current item starts.
    array: bool,
    item: usize,
    total: usize,
    items: Vec<Range<usize>>,
    found: Option<Selected>,
}

impl Search<'_> {
    /// Whether a value that starts `depth` containers deep needs [`Search::value_starts`].
    fn looks_at(&self, depth: usize) -> bool {
        self.found.is_none() && depth == self.on_path
    }

    /// A value starts at `at` in the output, `depth` containers deep (its first byte
    /// `first`): whether it is the next value on the pointer's path. If it is the selected
    /// value, it starts here; if it is an item of the selected array, the item does.
    fn value_starts(&mut self, depth: usize, at: usize, first: u8, parent: Option<Parent<'_>>) {
        let n = self.select.tokens.len();
        if self.start.is_some() {
            if depth == n + 1 && self.array {
                self.item = at;
            }
            return;
        }
        if depth > n {
            return;
        }
        let on_path = match parent {
            None => true,
            Some(Parent::Array(i)) => self.select.tokens[depth - 1].index == Some(i),
            Some(Parent::Object(key)) => is_key(key, &self.select.tokens[depth - 1].key),
        };
        if !on_path {
            return;
        }
        if depth == n {
            self.start = Some(at);
            self.array = first == b'[';
        }
        if matches!(first, b'{' | b'[') {
            self.on_path = depth + 1;
        }
    }

    /// The value `depth` containers deep ended at `at`, and the bytes after it were skipped.
    fn value_ends(&mut self, depth: usize, at: usize) {
        let n = self.select.tokens.len();
        if self.found.is_some() {
            return;
        }
        if depth == n + 1 && self.array && self.start.is_some() && self.on_path == n + 1 {
            self.total += 1;
            if self.items.len() < self.select.keep {
                if self.items.capacity() == 0 {
                    // Room for a page of results at once, rather than growing by doubling.
                    self.items.reserve_exact(self.select.keep.min(16));
                }
                self.items.push(self.item..at);
            }
        } else if depth == n
            && let Some(start) = self.start
        {
            self.found = Some(Selected {
                range: start..at,
                total: self.total,
                items: std::mem::take(&mut self.items),
            });
        }
        self.on_path = self.on_path.min(depth);
    }
}

/// The container of a value, as the search sees it.
enum Parent<'a> {
    Array(usize),
    /// An object, and the (quoted, compact) key of the value.
    Object(&'a str),
}

/// The compact form of `input`, or `None` when it is not JSON or holds something best left to
/// serde_json (see the module's comment).
pub fn compact(input: &[u8]) -> Option<Compact> {
    compact_selecting(input, None)
}

/// [`compact`], finding on the way what `select` selects.
pub fn compact_selecting(input: &[u8], select: Option<&Select>) -> Option<Compact> {
    let text = std::str::from_utf8(input).ok()?;
    let mut w = Writer {
        text,
        input: text.as_bytes(),
        pos: 0,
        out: String::with_capacity(text.len()),
        copied: 0,
    };
    let mut search = select.map(|select| Search {
        select,
        on_path: 0,
        start: None,
        array: false,
        item: 0,
        total: 0,
        items: Vec::new(),
        found: None,
    });
    // Sized for a typical tool answer, so neither grows while it is read.
    let mut stack: Vec<Frame> = Vec::with_capacity(16);
    // The output ranges of the keys of every open object, to find a repeated key.
    let mut keys: Vec<(usize, usize)> = Vec::with_capacity(32);
    let mut depth = 0;
    'value: loop {
        w.skip_ws();
        if let Some(s) = &mut search
            && s.looks_at(stack.len())
        {
            let parent = match stack.last() {
                None => None,
                Some(&Frame::Array(i)) => Some(Parent::Array(i)),
                Some(&Frame::Object(_)) => {
                    let &(start, end) = keys.last()?;
                    Some(Parent::Object(w.out_at(start, end)))
                }
            };
            s.value_starts(stack.len(), w.out_len(), w.peek()?, parent);
        }
        match w.peek()? {
            b'{' => {
                w.open(&mut stack, &mut depth, Frame::Object(keys.len()))?;
                w.skip_ws();
                if w.peek()? != b'}' {
                    let first = keys.len();
                    w.key(&mut keys, first)?;
                    continue 'value;
                }
                w.pos += 1;
                stack.pop();
            }
            b'[' => {
                w.open(&mut stack, &mut depth, Frame::Array(0))?;
                w.skip_ws();
                if w.peek()? != b']' {
                    continue 'value;
                }
                w.pos += 1;
                stack.pop();
            }
            b'"' => w.string()?,
            b't' => w.literal("true")?,
            b'f' => w.literal("false")?,
            b'n' => w.literal("null")?,
            b'-' | b'0'..=b'9' => w.number()?,
            _ => return None,
        }
        if let Some(s) = &mut search {
            s.value_ends(stack.len(), w.out_len());
        }
        // After a value: the next one in its container, or the container's end.
        loop {
            w.skip_ws();
            match stack.last_mut() {
                None => {
                    if w.pos != w.input.len() {
                        return None;
                    }
                    w.flush();
                    return Some(Compact {
                        json: w.out,
                        depth,
                        selected: search.and_then(|s| s.found),
                    });
                }
                Some(Frame::Array(index)) => match w.next()? {
                    b',' => {
                        *index += 1;
                        continue 'value;
                    }
                    b']' => {
                        stack.pop();
                    }
                    _ => return None,
                },
                Some(&mut Frame::Object(first_key)) => match w.next()? {
                    b',' => {
                        w.skip_ws();
                        w.key(&mut keys, first_key)?;
                        continue 'value;
                    }
                    b'}' => {
                        keys.truncate(first_key);
                        stack.pop();
                    }
                    _ => return None,
                },
            }
            if let Some(s) = &mut search {
                s.value_ends(stack.len(), w.out_len());
            }
        }
    }
}

/// The pass's reader and writer. What it reads is mostly written as it is (structure, plain
/// string runs, numbers spelled as serde_json spells them), so the text is copied lazily: the
/// input from `copied` to `pos` is output not yet copied into `out`, and only what differs
/// (whitespace dropped, an escape or a number written again) makes the pass copy what came
/// before. Compact input is copied once, at the end. Offsets in the output count that pending
/// input ([`Writer::out_len`]).
struct Writer<'a> {
    text: &'a str,
    /// `text`'s bytes.
    input: &'a [u8],
    pos: usize,
    out: String,
    copied: usize,
}

impl Writer<'_> {
    /// The length of the output so far.
    #[inline(always)]
    fn out_len(&self) -> usize {
        self.out.len() + (self.pos - self.copied)
    }

    /// Copies the pending input (up to `pos`) into `out`.
    fn flush(&mut self) {
        self.out.push_str(&self.text[self.copied..self.pos]);
        self.copied = self.pos;
    }

    /// The output from `start` to `end`: all in `out`, or all still pending (see
    /// [`Writer::key`], the only caller's source of ranges).
    #[inline(always)]
    fn out_at(&self, start: usize, end: usize) -> &str {
        if end <= self.out.len() {
            &self.out[start..end]
        } else {
            let from = self.copied + (start - self.out.len());
            &self.text[from..from + (end - start)]
        }
    }

    fn peek(&self) -> Option<u8> {
        self.input.get(self.pos).copied()
    }

    fn next(&mut self) -> Option<u8> {
        let b = self.peek()?;
        self.pos += 1;
        Some(b)
    }

    /// Skips whitespace, which the output leaves out. Called between any two tokens, so the
    /// test for none is inlined and the skip is not.
    #[inline(always)]
    fn skip_ws(&mut self) {
        if let Some(b' ' | b'\t' | b'\n' | b'\r') = self.peek() {
            self.drop_ws();
        }
    }

    #[inline(never)]
    fn drop_ws(&mut self) {
        self.flush();
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.peek() {
            self.pos += 1;
        }
        self.copied = self.pos;
    }

    fn open(&mut self, stack: &mut Vec<Frame>, depth: &mut usize, frame: Frame) -> Option<()> {
        self.pos += 1;
        stack.push(frame);
        if stack.len() >= SERDE_DEPTH_LIMIT {
            return None;
        }
        *depth = (*depth).max(stack.len());
        Some(())
    }

    fn literal(&mut self, word: &str) -> Option<()> {
        if !self.input[self.pos..].starts_with(word.as_bytes()) {
            return None;
        }
        self.pos += word.len();
        Some(())
    }

    /// A key and its colon; `None` if it repeats one of the object's earlier keys (from
    /// `keys[first..]`), since serde_json keeps only the last value of a repeated key. A key's
    /// output range lies all in `out` or all in the pending input: when an escape copied part
    /// of it, the rest is copied too. (A later copy moves all that is pending, so that stays
    /// true.)
    fn key(&mut self, keys: &mut Vec<(usize, usize)>, first: usize) -> Option<()> {
        if self.peek()? != b'"' {
            return None;
        }
        let start = self.out_len();
        self.string()?;
        if self.out.len() > start {
            self.flush();
        }
        let end = self.out_len();
        let earlier = &keys[first..];
        if earlier.len() >= MAX_KEYS_CHECKED {
            return None;
        }
        let this = self.out_at(start, end);
        let len = end - start;
        if earlier
            .iter()
            .any(|&(s, e)| e - s == len && self.out_at(s, e) == this)
        {
            return None;
        }
        keys.push((start, end));
        self.skip_ws();
        if self.next()? != b':' {
            return None;
        }
        Some(())
    }

    /// A string, escapes decoded and written again the way serde_json writes them.
    fn string(&mut self) -> Option<()> {
        // Read a run at a time: from the quote (or the last escape) to the next stop byte.
        // Every run starts and ends next to an ASCII byte, so what is copied is whole UTF-8.
        self.pos += 1;
        loop {
            self.pos += plain_run(&self.input[self.pos..])?;
            match self.input[self.pos] {
                b'"' => {
                    self.pos += 1;
                    return Some(());
                }
                b'\\' => {
                    self.flush();
                    self.pos += 1;
                    self.escape()?;
                    self.copied = self.pos;
                }
                // A raw control character: serde_json refuses it.
                _ => return None,
            }
        }
    }

    fn escape(&mut self) -> Option<()> {
        let c = match self.next()? {
            b'"' => '"',
            b'\\' => '\\',
            b'/' => '/',
            b'b' => '\u{8}',
            b'f' => '\u{c}',
            b'n' => '\n',
            b'r' => '\r',
            b't' => '\t',
            b'u' => {
                let unit = self.hex4()?;
                match unit {
                    0xD800..=0xDBFF => {
                        // A leading surrogate must be followed by its trailing half.
                        if !self.input[self.pos..].starts_with(b"\\u") {
                            return None;
                        }
                        self.pos += 2;
                        let low = self.hex4()?;
                        if !(0xDC00..=0xDFFF).contains(&low) {
                            return None;
                        }
                        let code = 0x10000 + ((unit - 0xD800) << 10) + (low - 0xDC00);
                        char::from_u32(code)?
                    }
                    0xDC00..=0xDFFF => return None,
                    _ => char::from_u32(unit)?,
                }
            }
            _ => return None,
        };
        self.write_char(c);
        Some(())
    }

    fn hex4(&mut self) -> Option<u32> {
        let digits = self.input.get(self.pos..self.pos + 4)?;
        let mut n = 0;
        for &d in digits {
            n = n * 16 + char::from(d).to_digit(16)?;
        }
        self.pos += 4;
        Some(n)
    }

    /// One decoded character, escaped as serde_json escapes it.
    fn write_char(&mut self, c: char) {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        match c {
            '"' => self.out.push_str("\\\""),
            '\\' => self.out.push_str("\\\\"),
            '\u{8}' => self.out.push_str("\\b"),
            '\u{c}' => self.out.push_str("\\f"),
            '\n' => self.out.push_str("\\n"),
            '\r' => self.out.push_str("\\r"),
            '\t' => self.out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let b = c as usize;
                self.out.push_str("\\u00");
                self.out.push(char::from(HEX[b >> 4]));
                self.out.push(char::from(HEX[b & 0xF]));
            }
            c => self.out.push(c),
        }
    }

    /// A number. An integer that fits serde_json's i64/u64 is written as it came (JSON's
    /// grammar allows only one spelling of it), and so is a decimal that serde_json prints as
    /// it is spelled ([`prints_as_spelled`]); anything else (exponents, `-0`, integers past
    /// u64, other fractions) is rendered by serde_json itself, token by token.
    fn number(&mut self) -> Option<()> {
        let start = self.pos;
        if self.peek() == Some(b'-') {
            self.pos += 1;
        }
        let int_start = self.pos;
        match self.next()? {
            b'0' => {}
            b'1'..=b'9' => self.digits(),
            _ => return None,
        }
        let int_digits = self.pos - int_start;
        let mut fraction = None;
        if self.peek() == Some(b'.') {
            self.pos += 1;
            let digits = self.pos;
            self.one_or_more_digits()?;
            fraction = Some(digits..self.pos);
        }
        let mut exponent = false;
        if let Some(b'e' | b'E') = self.peek() {
            self.pos += 1;
            if let Some(b'+' | b'-') = self.peek() {
                self.pos += 1;
            }
            self.one_or_more_digits()?;
            exponent = true;
        }
        let token = &self.text[start..self.pos];
        if let Some(fraction) = fraction.clone()
            && !exponent
            && prints_as_spelled(
                &self.input[int_start..int_start + int_digits],
                &self.input[fraction],
            )
        {
            return Some(());
        }
        let plain = fraction.is_none() && !exponent;
        let negative = int_start > start;
        let fits = if negative {
            int_digits <= 18 && token != "-0"
        } else {
            int_digits <= 19
        };
        if plain && fits {
            return Some(());
        }
        let n: serde_json::Number = serde_json::from_str(token).ok()?;
        let rendered = serde_json::to_string(&n).ok()?;
        self.out.push_str(&self.text[self.copied..start]);
        self.out.push_str(&rendered);
        self.copied = self.pos;
        Some(())
    }

    fn digits(&mut self) {
        while let Some(b'0'..=b'9') = self.peek() {
            self.pos += 1;
        }
    }

    fn one_or_more_digits(&mut self) -> Option<()> {
        match self.next()? {
            b'0'..=b'9' => {
                self.digits();
                Some(())
            }
            _ => None,
        }
    }
}

/// How many bytes at the start of `bytes` need nothing done in a string: up to the first
/// quote, backslash or control character (`None`: the text ends first). Sixteen bytes at a
/// time with SSE2 (every x86_64 has it), then what is left a word at a time.
pub(crate) fn plain_run(bytes: &[u8]) -> Option<usize> {
    let mut i = 0;
    #[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
    while let Some(block) = bytes.get(i..i + 16) {
        if let Some(at) = block_stop(block.try_into().ok()?) {
            return Some(i + at);
        }
        i += 16;
    }
    plain_run_by_words(&bytes[i..]).map(|at| i + at)
}

/// The first stop byte of sixteen: three byte-wise compares (equal to `"`, equal to `\`, and
/// unsigned no greater than 0x1f) or-ed into one mask, one bit a byte.
#[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
#[inline(always)]
fn block_stop(block: &[u8; 16]) -> Option<usize> {
    use safe_arch::{
        bitor_m128i, cmp_eq_mask_i8_m128i, load_unaligned_m128i, min_u8_m128i, move_mask_i8_m128i,
        set_splat_i8_m128i,
    };
    let v = load_unaligned_m128i(block);
    let quote = cmp_eq_mask_i8_m128i(v, set_splat_i8_m128i(b'"' as i8));
    let slash = cmp_eq_mask_i8_m128i(v, set_splat_i8_m128i(b'\\' as i8));
    let control = cmp_eq_mask_i8_m128i(min_u8_m128i(v, set_splat_i8_m128i(0x1f)), v);
    let mask = move_mask_i8_m128i(bitor_m128i(bitor_m128i(quote, slash), control));
    (mask != 0).then(|| mask.trailing_zeros() as usize)
}

/// [`plain_run`] eight bytes at a time: three byte-wise tests (a byte equal to `"`, equal to
/// `\`, below 0x20) each set the high bit of a byte they match. A borrow can also set it in
/// bytes above a match, never below the first one, so the lowest bit set is the first stop
/// byte. The last few bytes (fewer than eight) are looked at one by one.
fn plain_run_by_words(bytes: &[u8]) -> Option<usize> {
    const ONES: u64 = u64::from_ne_bytes([1; 8]);
    const HIGH: u64 = ONES << 7;
    let mut i = 0;
    while let Some(chunk) = bytes.get(i..i + 8) {
        let word = u64::from_le_bytes(<[u8; 8]>::try_from(chunk).ok()?);
        let quote = word ^ (ONES * u64::from(b'"'));
        let slash = word ^ (ONES * u64::from(b'\\'));
        let flagged = ((quote.wrapping_sub(ONES) & !quote)
            | (slash.wrapping_sub(ONES) & !slash)
            | (word.wrapping_sub(ONES * 0x20) & !word))
            & HIGH;
        if flagged != 0 {
            return Some(i + (flagged.trailing_zeros() / 8) as usize);
        }
        i += 8;
    }
    let rest = bytes.get(i..)?;
    rest.iter()
        .position(|&b| STOPS[usize::from(b)])
        .map(|at| i + at)
}

/// Whether serde_json prints the decimal `int.frac` (no exponent) as it is spelled. It does
/// when the decimal has at most 15 significant digits: an f64 tells every such decimal apart,
/// so the shortest digits that read back as its nearest f64 (what serde_json's ryu prints)
/// are the decimal's own. And ryu must print them the same way: in plain notation (from
/// 1e-5 up: at most four zeros after `0.`), with no trailing zero except a lone `.0`.
fn prints_as_spelled(int: &[u8], frac: &[u8]) -> bool {
    let frac = if frac == b"0" { &[][..] } else { frac };
    if frac.last() == Some(&b'0') {
        return false;
    }
    let significant = if int == b"0" {
        let zeros = frac.iter().take_while(|&&d| d == b'0').count();
        if zeros > 4 {
            return false;
        }
        frac.len() - zeros
    } else {
        int.len() + frac.len()
    };
    significant <= 15
}

/// The end of the value that starts at `at` in a compact text (one [`compact`] wrote).
fn value_end(text: &[u8], at: usize) -> usize {
    let mut depth = 0usize;
    let mut i = at;
    while i < text.len() {
        match text[i] {
            b'"' => {
                i += 1;
                // Jump from escape to escape to the closing quote.
                loop {
                    match memchr::memchr2(b'"', b'\\', text.get(i..).unwrap_or_default()) {
                        Some(j) if text[i + j] == b'"' => {
                            i += j;
                            break;
                        }
                        Some(j) => i += j + 2,
                        None => {
                            i = text.len();
                            break;
                        }
                    }
                }
                i += 1;
            }
            b'{' | b'[' => {
                depth += 1;
                i += 1;
            }
            b'}' | b']' => {
                depth = depth.saturating_sub(1);
                i += 1;
            }
            _ => {
                if depth == 0 {
                    // A literal or number: it runs to the next separator.
                    while i < text.len() && !matches!(text[i], b',' | b'}' | b']' | b':') {
                        i += 1;
                    }
                    return i;
                }
                i += 1;
            }
        }
        if depth == 0 {
            return i;
        }
    }
    i
}

/// The entries of the array or object that starts `text` (compact), one at a time: each
/// entry's compact text (for an object, `"key":value`), so a search can stop at the one it wants.
struct Entries<'a> {
    text: &'a str,
    /// Where the next entry starts; `None` once the closing bracket was reached.
    at: Option<usize>,
    close: u8,
}

impl<'a> Entries<'a> {
    fn new(text: &'a str, open: u8, close: u8) -> Option<Entries<'a>> {
        let b = text.as_bytes();
        if b.first() != Some(&open) {
            return None;
        }
        let at = if b.get(1) == Some(&close) {
            None
        } else {
            Some(1)
        };
        Some(Entries { text, at, close })
    }

    /// The next entry: `Some(Some(text))`, `Some(None)` after the last one, `None` when the
    /// text is not the compact form it should be.
    fn next_entry(&mut self, object: bool) -> Option<Option<(&'a str, &'a str)>> {
        let Some(i) = self.at else {
            return Some(None);
        };
        let b = self.text.as_bytes();
        let (key, start) = if object {
            let key_end = value_end(b, i);
            if b.get(key_end) != Some(&b':') {
                return None;
            }
            (self.text.get(i..key_end)?, key_end + 1)
        } else {
            ("", i)
        };
        let end = value_end(b, start);
        let value = self.text.get(start..end)?;
        self.at = match b.get(end) {
            Some(b',') => Some(end + 1),
            Some(&c) if c == self.close => None,
            _ => return None,
        };
        Some(Some((key, value)))
    }
}

/// The items of the array `text` (compact), each as its compact text.
pub fn items(text: &str) -> Option<Vec<&str>> {
    let mut entries = Entries::new(text, b'[', b']')?;
    let mut out = Vec::new();
    while let Some((_, item)) = entries.next_entry(false)? {
        out.push(item);
    }
    Some(out)
}

/// The members of the object `text` (compact): each key as its compact (quoted) text, and
/// its value's.
pub fn members(text: &str) -> Option<Vec<(&str, &str)>> {
    let mut entries = Entries::new(text, b'{', b'}')?;
    let mut out = Vec::new();
    while let Some(member) = entries.next_entry(true)? {
        out.push(member);
    }
    Some(out)
}

/// The value of the member `key` of the object `text` (compact), scanning only up to it (a
/// compact text has no repeated key).
pub fn member<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    let mut entries = Entries::new(text, b'{', b'}')?;
    loop {
        let (k, v) = entries.next_entry(true)??;
        if is_key(k, key) {
            return Some(v);
        }
    }
}

/// Whether the compact (quoted) key text `quoted` is the key `key`.
pub fn is_key(quoted: &str, key: &str) -> bool {
    match quoted.strip_prefix('"').and_then(|q| q.strip_suffix('"')) {
        // Without an escape the text between the quotes is the key itself.
        Some(inner) if !inner.contains('\\') => inner == key,
        // An escaped key: compare it with the wanted one written the same way.
        Some(_) => serde_json::to_string(key).is_ok_and(|k| k == quoted),
        None => false,
    }
}

/// What the JSON Pointer `pointer` selects in the compact text `text`, resolved as
/// `serde_json::Value::pointer` resolves it; `None` if it does not resolve.
pub fn pointer<'a>(text: &'a str, pointer: &str) -> Option<&'a str> {
    if pointer.is_empty() {
        return Some(text);
    }
    let mut at = text;
    for token in pointer.strip_prefix('/')?.split('/') {
        let token = if token.contains('~') {
            std::borrow::Cow::Owned(token.replace("~1", "/").replace("~0", "~"))
        } else {
            std::borrow::Cow::Borrowed(token)
        };
        at = match at.as_bytes().first()? {
            b'{' => member(at, &token)?,
            b'[' => {
                if token.starts_with('+') || (token.starts_with('0') && token.len() != 1) {
                    return None;
                }
                let index: usize = token.parse().ok()?;
                let mut entries = Entries::new(at, b'[', b']')?;
                for _ in 0..index {
                    entries.next_entry(false)??;
                }
                entries.next_entry(false)??.1
            }
            _ => return None,
        };
    }
    Some(at)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::Value;

    /// What the record held before this pass existed: the value parsed and serialized.
    fn serde_compact(input: &[u8]) -> Option<String> {
        let v: Value = serde_json::from_slice(input).ok()?;
        serde_json::to_string(&v).ok()
    }

    /// `compact` either agrees with serde_json byte for byte or leaves the text to it.
    fn agrees(input: &[u8]) -> Option<Compact> {
        let ours = compact(input);
        if let Some(c) = &ours {
            assert_eq!(
                Some(&c.json),
                serde_compact(input).as_ref(),
                "{:?}",
                String::from_utf8_lossy(input)
            );
            assert_eq!(c.depth, crate::body::json_depth(input));
        }
        ours
    }

    #[test]
    fn edge_cases_match_serde_json() {
        let handled = [
            r#" { "a" : [ 1 , 2 ] , "b" : { } , "c" : [ ] } "#,
            r#""é\u00e9\u00E9\/\"\\\b\f\n\r\t\u0000\u001f\u007f\u2028""#,
            r#""\ud83d\ude00 😀 \uD83D\uDE00""#,
            "[0,-1,9223372036854775807,-9223372036854775808,18446744073709551615]",
            "[18446744073709551616,-9223372036854775809,99999999999999999999999]",
            "[-0,-0.0,0.0,1.0,1.5,1e2,1E+2,1e-7,0.1e-7,2.5E-3,123456789.123456789,1e308]",
            "[true,false,null]",
            "\"\"",
            "{\"\":\"\"}",
            "7",
            "\n\t 7 \r\n",
        ];
        for text in handled {
            assert!(agrees(text.as_bytes()).is_some(), "{text}");
        }
        let left_to_serde = [
            r#"{"a":1,"b":2,"a":3}"#,
            r#"{"a":1,"\u0061":2}"#,
            // Repeated keys, one copied into the output and one still pending, either way.
            r#"{"\u0061":1,"a":2}"#,
            r#"{ "b": {"a" :1.50, "x":[2E3], "\u0061":2}}"#,
            r#"{"a\n":1,"b":[ ],"a\u000a":2}"#,
            r#""\ud83d""#,
            r#""\ude00""#,
            r#""\ud83d\u0041""#,
            "1e400",
            "[1,]",
            "{\"a\":1,}",
            "[01]",
            "[1.]",
            "[.5]",
            "[+1]",
            "[1e]",
            "\"\u{1}\"",
            "\"\\x\"",
            "\"\\u12\"",
            "tru",
            "nul",
            "[1] 2",
            "",
            "   ",
            "{\"a\" 1}",
            "{1:2}",
            "[",
            "]",
        ];
        for text in left_to_serde {
            assert!(agrees(text.as_bytes()).is_none(), "{text}");
        }
        assert!(agrees(b"\"\xff\"").is_none());
        let deep = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
        assert_eq!(agrees(deep(127).as_bytes()).map(|c| c.depth), Some(127));
        assert!(agrees(deep(128).as_bytes()).is_none());
        assert!(serde_compact(deep(128).as_bytes()).is_none());
        let wide: String = (0..=MAX_KEYS_CHECKED)
            .map(|i| format!("\"k{i}\":{i}"))
            .collect::<Vec<_>>()
            .join(",");
        assert!(agrees(format!("{{{wide}}}").as_bytes()).is_none());
    }

    /// Random JSON texts: values with unique keys, written with random whitespace, random
    /// spellings of every character (raw or `\u` escaped, surrogate pairs, `\/`) and of
    /// numbers.
    fn text() -> impl Strategy<Value = String> {
        let ws = prop::sample::select(vec!["", " ", "\n", "\t", "\r\n  "]);
        let chars = prop::collection::vec(
            (
                prop::sample::select(vec![
                    'a',
                    'Z',
                    '0',
                    ' ',
                    '"',
                    '\\',
                    '/',
                    '\u{0}',
                    '\u{1f}',
                    '\n',
                    '\t',
                    '\u{7f}',
                    'é',
                    'ß',
                    '中',
                    '\u{2028}',
                    '😀',
                    '\u{10ffff}',
                    '\u{e000}',
                ]),
                0..3u8,
            ),
            0..6,
        );
        let string = chars.prop_map(|cs| {
            let mut s = String::from("\"");
            for (c, how) in cs {
                match (c, how) {
                    ('"', _) => s.push_str("\\\""),
                    ('\\', _) => s.push_str("\\\\"),
                    ('/', 1) => s.push_str("\\/"),
                    (c, _) if (c as u32) < 0x20 => s.push_str(&format!("\\u{:04x}", c as u32)),
                    (c, 1) => {
                        let mut units = [0u16; 2];
                        for u in c.encode_utf16(&mut units) {
                            s.push_str(&format!("\\u{u:04X}"));
                        }
                    }
                    ('\n', 2) => s.push_str("\\n"),
                    (c, _) => s.push(c),
                }
            }
            s.push('"');
            s
        });
        let number = prop::sample::select(vec![
            "0",
            "-0",
            "7",
            "-7",
            "1.0",
            "-0.0",
            "1e3",
            "1E-3",
            "2.5e+10",
            "0.30000000000000004",
            "1e-320",
            "123456789012345678",
            "-123456789012345678",
            "1234567890123456789",
            "-1234567890123456789",
            "18446744073709551615",
            "18446744073709551616",
            "-9223372036854775808",
            "-9223372036854775809",
            "123456789012345678901234567890",
            "0.5",
            "-12.25",
            "0.00001",
            "-0.000012",
            "0.000001",
            "1.50",
            "100.0",
            "0.0",
            "0.10",
            "123456789012345.6",
            "1234567890123456.7",
            "0.1234567890123456",
            "9007199254740993.0",
            "0.3333333333333333",
        ])
        .prop_map(String::from);
        let leaf = prop_oneof![
            string.clone(),
            number,
            Just("true".to_string()),
            Just("false".to_string()),
            Just("null".to_string()),
        ];
        let texts = leaf.prop_recursive(6, 64, 6, move |inner| {
            let ws = ws.clone();
            prop_oneof![
                (prop::collection::vec(inner.clone(), 0..6), ws.clone())
                    .prop_map(|(items, w)| format!("[{w}{}{w}]", items.join(&format!("{w},{w}")))),
                (
                    prop::collection::btree_map("[a-c]{0,2}", inner, 0..6),
                    ws.clone()
                )
                    .prop_map(|(fields, w)| {
                        let fields: Vec<String> = fields
                            .into_iter()
                            .map(|(k, v)| format!("\"{k}\"{w}:{w}{v}"))
                            .collect();
                        format!("{{{w}{}{w}}}", fields.join(&format!(",{w}")))
                    }),
            ]
        });
        (texts, prop::sample::select(vec!["", " ", "\n"])).prop_map(|(t, w)| format!("{w}{t}{w}"))
    }

    #[test]
    fn pointers_resolve_as_serde_json_resolves_them() {
        let text = r#"{"a":[1,{"b/c":"x\\\"]}","m~n":[[]]},"end"],"":{"":-1.5e-7},"0":true,"n":null,"q\"k\\":7}"#;
        // The same value spelled with whitespace and escapes in the keys on the paths, so that
        // keys copied into the output and keys still pending are both looked at.
        let spelled = r#" { "\u0061" : [ 1 , { "b\/c" : "x\\\"]}", "m~n":[ [ ] ] } , "end" ] ,
            "" : { "" : -1.5e-7 } , "\u0030":true, "n" :null, "q\"k\u005c":7 } "#;
        let value: Value = serde_json::from_str(text).unwrap();
        assert_eq!(serde_json::from_str::<Value>(spelled).unwrap(), value);
        let c = compact(text.as_bytes()).unwrap().json;
        assert_eq!(compact(spelled.as_bytes()).unwrap().json, c);
        for p in [
            "",
            "/a",
            "/a/0",
            "/a/1",
            "/a/1/b~1c",
            "/a/1/m~0n",
            "/a/1/m~0n/0",
            "/a/2",
            "/a/3",
            "/a/01",
            "/a/+1",
            "/a/-1",
            "/",
            "//",
            "/0",
            "/n",
            "/n/x",
            "a",
            "/a/1/b/c",
            "/zz",
            "/q\"k\\",
            "/q\"k",
        ] {
            let ours = pointer(&c, p).map(|s| serde_json::from_str::<Value>(s).unwrap());
            assert_eq!(ours.as_ref(), value.pointer(p), "{p}");
            if p.is_empty() || p.starts_with('/') {
                selects_what_pointer_finds(text, p, 1);
                selects_what_pointer_finds(spelled, p, 1);
            }
        }
    }

    /// The pointers of every value in `value`, and a few that resolve nowhere.
    fn pointers(value: &Value, at: String, out: &mut Vec<String>) {
        match value {
            Value::Array(items) => {
                for (i, v) in items.iter().enumerate() {
                    pointers(v, format!("{at}/{i}"), out);
                }
                out.push(format!("{at}/{}", items.len()));
                out.push(format!("{at}/00"));
            }
            Value::Object(map) => {
                for (k, v) in map {
                    pointers(
                        v,
                        format!("{at}/{}", k.replace('~', "~0").replace('/', "~1")),
                        out,
                    );
                }
                out.push(format!("{at}/zz"));
            }
            _ => out.push(format!("{at}/0")),
        }
        out.push(at);
    }

    /// `compact_selecting` writes what `compact` writes, and selects what [`pointer`] finds
    /// in that text: the same value and, for an array, its item count and first `keep` items.
    fn selects_what_pointer_finds(text: &str, p: &str, keep: usize) {
        let plain = compact(text.as_bytes());
        let select = Select::new(p, keep).unwrap();
        let ours = compact_selecting(text.as_bytes(), Some(&select));
        assert_eq!(
            ours.as_ref().map(|c| (&c.json, c.depth)),
            plain.as_ref().map(|c| (&c.json, c.depth)),
            "{text}"
        );
        let Some(c) = ours else { return };
        let want = pointer(&c.json, p);
        let got = c.selected.as_ref().map(|s| &c.json[s.range.clone()]);
        assert_eq!(got, want, "{p} in {text}");
        if let (Some(s), Some(want)) = (&c.selected, want) {
            let want_items = if want.starts_with('[') {
                items(want).unwrap()
            } else {
                Vec::new()
            };
            let got_items: Vec<&str> = s.items.iter().map(|r| &c.json[r.clone()]).collect();
            assert_eq!(s.total, want_items.len(), "{p} in {text}");
            assert_eq!(
                got_items,
                want_items[..keep.min(want_items.len())],
                "{p} in {text}"
            );
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        #[test]
        fn items_and_members_split_what_compact_wrote(text in text()) {
            let Some(c) = compact(text.as_bytes()) else { return Ok(()) };
            let value: Value = serde_json::from_str(&c.json).unwrap();
            match &value {
                Value::Array(vs) => {
                    let got = items(&c.json).unwrap();
                    prop_assert_eq!(got.len(), vs.len());
                    for (s, v) in got.iter().zip(vs) {
                        prop_assert_eq!(*s, serde_json::to_string(v).unwrap());
                    }
                }
                Value::Object(map) => {
                    let got = members(&c.json).unwrap();
                    prop_assert_eq!(got.len(), map.len());
                    for ((k, s), (mk, v)) in got.iter().zip(map) {
                        prop_assert_eq!(*k, serde_json::to_string(mk).unwrap());
                        prop_assert_eq!(*s, serde_json::to_string(v).unwrap());
                    }
                }
                _ => {
                    prop_assert!(items(&c.json).is_none() && members(&c.json).is_none());
                }
            }
        }

        #[test]
        fn the_pass_selects_what_pointers_select(text in text(), keep in 0..4usize) {
            let Some(c) = compact(text.as_bytes()) else { return Ok(()) };
            let value: Value = serde_json::from_str(&c.json).unwrap();
            let mut all = Vec::new();
            pointers(&value, String::new(), &mut all);
            for p in &all {
                selects_what_pointer_finds(&text, p, keep);
            }
        }

        #[test]
        fn plain_runs_end_at_the_first_stop_byte(
            bytes in proptest::collection::vec(
                prop_oneof![
                    1 => Just(b'"'),
                    1 => Just(b'\\'),
                    1 => 0u8..0x20,
                    1 => Just(0x7f),
                    8 => 0x20u8..=0xff,
                ],
                0..80,
            ),
            plain in 0usize..40,
        ) {
            // Mostly plain bytes first, so runs cross several blocks and words.
            let mut input = vec![b'a'; plain];
            input.extend(bytes);
            let first = input.iter().position(|&b| b < 0x20 || b == b'"' || b == b'\\');
            prop_assert_eq!(plain_run(&input), first, "{:?}", input);
            prop_assert_eq!(plain_run_by_words(&input), first, "{:?}", input);
        }

        #[test]
        fn compact_is_what_serde_json_writes(text in text()) {
            let ours = agrees(text.as_bytes());
            // Unique keys and shallow nesting: nothing is left to serde_json unless it fails.
            prop_assert_eq!(ours.is_some(), serde_compact(text.as_bytes()).is_some(), "{}", text);
        }

        #[test]
        fn decimals_are_written_as_serde_json_writes_them(
            negative in any::<bool>(),
            int in prop_oneof![Just(String::from("0")), "[1-9][0-9]{0,17}"],
            frac in "[0-9]{1,19}",
        ) {
            let text = format!("{}{int}.{frac}", if negative { "-" } else { "" });
            prop_assert!(agrees(text.as_bytes()).is_some(), "{}", text);
        }

        #[test]
        fn arbitrary_bytes_never_disagree(bytes in prop::collection::vec(any::<u8>(), 0..40)) {
            agrees(&bytes);
        }

        #[test]
        fn mangled_texts_never_disagree(text in text(), cut in any::<prop::sample::Index>(), b in any::<u8>()) {
            let mut bytes = text.into_bytes();
            let i = cut.index(bytes.len().max(1)).min(bytes.len());
            bytes.insert(i, b);
            agrees(&bytes);
        }
    }
}
