//! Compact JSON in one pass: a tool's raw bytes validated and rewritten as the compact UTF-8
//! text the record holds, byte for byte what serde_json writes for the value it would parse,
//! without building the value.
//!
//! The pass is iterative (an explicit stack, no recursion). Whenever the text holds something
//! whose rendering this pass does not reproduce itself (an object with a repeated key, nesting
//! serde_json refuses, a string escape it would reject), [`compact`] gives up with `None` and
//! the caller takes the parse-and-serialize path, so the result never differs from serde_json's.

/// serde_json refuses nesting this deep (its recursion limit), so the pass stops there too.
const SERDE_DEPTH_LIMIT: usize = 128;
/// An object with more keys than this is left to serde_json: repeated keys are found by
/// comparing each key with the earlier ones.
const MAX_KEYS_CHECKED: usize = 64;

/// A JSON text in compact form, as serde_json serializes its value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Compact {
    /// The compact text: no whitespace, strings with non-ASCII unescaped and only `"`, `\` and
    /// control characters escaped, numbers as serde_json renders them.
    pub json: String,
    /// How deeply arrays and objects nest (the measure of [`crate::body::json_depth`]).
    pub depth: usize,
}

enum Frame {
    Array,
    /// An object, and where its keys' ranges start in the key list.
    Object(usize),
}

/// The compact form of `input`, or `None` when it is not JSON or holds something best left to
/// serde_json (see the module's comment).
pub fn compact(input: &[u8]) -> Option<Compact> {
    let text = std::str::from_utf8(input).ok()?;
    let bytes = text.as_bytes();
    let mut w = Writer {
        input: bytes,
        pos: 0,
        out: Vec::with_capacity(bytes.len()),
    };
    let mut stack: Vec<Frame> = Vec::new();
    // The output ranges of the keys of every open object, to find a repeated key.
    let mut keys: Vec<(usize, usize)> = Vec::new();
    let mut depth = 0;
    'value: loop {
        w.skip_ws();
        match w.peek()? {
            b'{' => {
                w.open(&mut stack, &mut depth, Frame::Object(keys.len()))?;
                w.out.push(b'{');
                w.skip_ws();
                if w.peek()? == b'}' {
                    w.pos += 1;
                    w.out.push(b'}');
                    stack.pop();
                } else {
                    let first = keys.len();
                    w.key(&mut keys, first)?;
                    continue 'value;
                }
            }
            b'[' => {
                w.open(&mut stack, &mut depth, Frame::Array)?;
                w.out.push(b'[');
                w.skip_ws();
                if w.peek()? == b']' {
                    w.pos += 1;
                    w.out.push(b']');
                    stack.pop();
                } else {
                    continue 'value;
                }
            }
            b'"' => w.string()?,
            b't' => w.literal(b"true")?,
            b'f' => w.literal(b"false")?,
            b'n' => w.literal(b"null")?,
            b'-' | b'0'..=b'9' => w.number()?,
            _ => return None,
        }
        // After a value: the next one in its container, or the container's end.
        loop {
            w.skip_ws();
            match stack.last() {
                None => {
                    if w.pos != bytes.len() {
                        return None;
                    }
                    let json = String::from_utf8(w.out).ok()?;
                    return Some(Compact { json, depth });
                }
                Some(Frame::Array) => match w.next()? {
                    b',' => {
                        w.out.push(b',');
                        continue 'value;
                    }
                    b']' => {
                        w.out.push(b']');
                        stack.pop();
                    }
                    _ => return None,
                },
                Some(&Frame::Object(first_key)) => match w.next()? {
                    b',' => {
                        w.out.push(b',');
                        w.skip_ws();
                        w.key(&mut keys, first_key)?;
                        continue 'value;
                    }
                    b'}' => {
                        w.out.push(b'}');
                        keys.truncate(first_key);
                        stack.pop();
                    }
                    _ => return None,
                },
            }
        }
    }
}

struct Writer<'a> {
    input: &'a [u8],
    pos: usize,
    out: Vec<u8>,
}

impl Writer<'_> {
    fn peek(&self) -> Option<u8> {
        self.input.get(self.pos).copied()
    }

    fn next(&mut self) -> Option<u8> {
        let b = self.peek()?;
        self.pos += 1;
        Some(b)
    }

    fn skip_ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.peek() {
            self.pos += 1;
        }
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

    fn literal(&mut self, word: &[u8]) -> Option<()> {
        if !self.input[self.pos..].starts_with(word) {
            return None;
        }
        self.pos += word.len();
        self.out.extend_from_slice(word);
        Some(())
    }

    /// A key and its colon; `None` if it repeats one of the object's earlier keys (from
    /// `keys[first..]`), since serde_json keeps only the last value of a repeated key.
    fn key(&mut self, keys: &mut Vec<(usize, usize)>, first: usize) -> Option<()> {
        if self.peek()? != b'"' {
            return None;
        }
        let start = self.out.len();
        self.string()?;
        let end = self.out.len();
        let earlier = &keys[first..];
        if earlier.len() >= MAX_KEYS_CHECKED {
            return None;
        }
        let this = &self.out[start..end];
        if earlier.iter().any(|&(s, e)| &self.out[s..e] == this) {
            return None;
        }
        keys.push((start, end));
        self.skip_ws();
        if self.next()? != b':' {
            return None;
        }
        self.out.push(b':');
        Some(())
    }

    /// A string, escapes decoded and written again the way serde_json writes them.
    fn string(&mut self) -> Option<()> {
        self.pos += 1;
        self.out.push(b'"');
        loop {
            // Copy the run of bytes that need nothing done: up to the next quote or backslash
            // (memchr), which must hold no raw control character (serde_json refuses one).
            let rest = &self.input[self.pos..];
            let run = memchr::memchr2(b'"', b'\\', rest)?;
            if has_control(&rest[..run]) {
                return None;
            }
            self.out.extend_from_slice(&rest[..run]);
            self.pos += run;
            match self.next()? {
                b'"' => {
                    self.out.push(b'"');
                    return Some(());
                }
                b'\\' => self.escape()?,
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
            '"' => self.out.extend_from_slice(b"\\\""),
            '\\' => self.out.extend_from_slice(b"\\\\"),
            '\u{8}' => self.out.extend_from_slice(b"\\b"),
            '\u{c}' => self.out.extend_from_slice(b"\\f"),
            '\n' => self.out.extend_from_slice(b"\\n"),
            '\r' => self.out.extend_from_slice(b"\\r"),
            '\t' => self.out.extend_from_slice(b"\\t"),
            c if (c as u32) < 0x20 => {
                let b = c as usize;
                self.out
                    .extend_from_slice(&[b'\\', b'u', b'0', b'0', HEX[b >> 4], HEX[b & 0xF]]);
            }
            c => {
                let mut buf = [0; 4];
                self.out
                    .extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
            }
        }
    }

    /// A number. An integer that fits serde_json's i64/u64 is written as it came (JSON's
    /// grammar allows only one spelling of it); anything else (fractions, exponents, `-0`,
    /// integers past u64) is rendered by serde_json itself, token by token.
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
        let mut plain = true;
        if self.peek() == Some(b'.') {
            self.pos += 1;
            self.one_or_more_digits()?;
            plain = false;
        }
        if let Some(b'e' | b'E') = self.peek() {
            self.pos += 1;
            if let Some(b'+' | b'-') = self.peek() {
                self.pos += 1;
            }
            self.one_or_more_digits()?;
            plain = false;
        }
        let token = &self.input[start..self.pos];
        let negative = int_start > start;
        let fits = if negative {
            int_digits <= 18 && token != b"-0"
        } else {
            int_digits <= 19
        };
        if plain && fits {
            self.out.extend_from_slice(token);
            return Some(());
        }
        let n: serde_json::Number = serde_json::from_slice(token).ok()?;
        serde_json::to_writer(&mut self.out, &n).ok()
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

/// Whether `bytes` holds a control character (below 0x20). Folded without an early exit, so
/// the loop is vectorized.
fn has_control(bytes: &[u8]) -> bool {
    bytes.iter().fold(false, |seen, &b| seen | (b < 0x20))
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
        let value: Value = serde_json::from_str(text).unwrap();
        let c = compact(text.as_bytes()).unwrap().json;
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
        fn compact_is_what_serde_json_writes(text in text()) {
            let ours = agrees(text.as_bytes());
            // Unique keys and shallow nesting: nothing is left to serde_json unless it fails.
            prop_assert_eq!(ours.is_some(), serde_compact(text.as_bytes()).is_some(), "{}", text);
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
