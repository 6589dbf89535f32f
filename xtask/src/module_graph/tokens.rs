//! Just enough of Rust's lexer to find paths: identifiers, `::` and single
//! punctuation characters. Comments and literals are dropped, so a path named
//! in a doc comment or a string is no dependency.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Token<'a> {
    /// Keywords included; a raw identifier loses its `r#`.
    Ident(&'a str),
    PathSep,
    Punct(char),
}

pub fn tokenize(src: &str) -> Vec<Token<'_>> {
    Lexer { src, pos: 0 }.run()
}

struct Lexer<'a> {
    src: &'a str,
    pos: usize,
}

fn is_ident_start(b: u8) -> bool {
    b.is_ascii_alphabetic() || b == b'_'
}

fn is_ident_continue(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

impl<'a> Lexer<'a> {
    fn byte(&self, at: usize) -> Option<u8> {
        self.src.as_bytes().get(at).copied()
    }

    fn rest(&self) -> &'a str {
        &self.src[self.pos..]
    }

    fn run(mut self) -> Vec<Token<'a>> {
        let mut tokens = Vec::new();
        while let Some(b) = self.byte(self.pos) {
            if self.rest().starts_with("//") {
                self.pos = self
                    .rest()
                    .find('\n')
                    .map_or(self.src.len(), |n| self.pos + n);
            } else if self.rest().starts_with("/*") {
                self.block_comment();
            } else if b == b'"' {
                self.pos += 1;
                self.quoted(b'"');
            } else if b == b'\'' {
                self.char_or_lifetime();
            } else if b.is_ascii_digit() {
                self.pos = self.ident_end(self.pos);
            } else if is_ident_start(b) {
                if let Some(token) = self.word() {
                    tokens.push(token);
                }
            } else if self.rest().starts_with("::") {
                tokens.push(Token::PathSep);
                self.pos += 2;
            } else if b.is_ascii() {
                if !b.is_ascii_whitespace() {
                    tokens.push(Token::Punct(char::from(b)));
                }
                self.pos += 1;
            } else {
                // Outside comments and literals only in identifiers, which
                // paths between modules do not use.
                self.pos += self.rest().chars().next().map_or(1, char::len_utf8);
            }
        }
        tokens
    }

    fn ident_end(&self, mut at: usize) -> usize {
        while self.byte(at).is_some_and(is_ident_continue) {
            at += 1;
        }
        at
    }

    /// Block comments nest.
    fn block_comment(&mut self) {
        let mut depth = 0;
        while self.pos < self.src.len() {
            if self.rest().starts_with("/*") {
                depth += 1;
                self.pos += 2;
            } else if self.rest().starts_with("*/") {
                depth -= 1;
                self.pos += 2;
                if depth == 0 {
                    return;
                }
            } else {
                self.pos += 1;
            }
        }
    }

    /// Skips past the closing `close`, honouring backslash escapes.
    fn quoted(&mut self, close: u8) {
        while let Some(b) = self.byte(self.pos) {
            self.pos += if b == b'\\' { 2 } else { 1 };
            if b == close {
                return;
            }
        }
        self.pos = self.src.len();
    }

    /// `'x'`, `'\n'` are literals; `'a` in `&'a str` or a loop label is
    /// not, and only its quote is skipped.
    fn char_or_lifetime(&mut self) {
        let after = self.pos + 1;
        let is_char = match self.byte(after) {
            Some(b'\\') => true,
            Some(_) => {
                let width = self.src[after..].chars().next().map_or(1, char::len_utf8);
                self.byte(after + width) == Some(b'\'')
            }
            None => false,
        };
        self.pos = after;
        if is_char {
            self.quoted(b'\'');
        }
    }

    /// An identifier, or the prefix of a literal (`r"…"`, `r#"…"#`, `b"…"`,
    /// `br"…"`, `c"…"`, `b'x'`), which is skipped whole.
    fn word(&mut self) -> Option<Token<'a>> {
        let start = self.pos;
        let end = self.ident_end(start);
        let word = &self.src[start..end];
        self.pos = end;
        match (word, self.byte(end)) {
            ("r" | "br" | "cr", Some(b'"' | b'#')) => {
                let hashes = self.src[end..].bytes().take_while(|&b| b == b'#').count();
                let after = end + hashes;
                match self.byte(after) {
                    Some(b'"') => {
                        let closing = format!("\"{}", "#".repeat(hashes));
                        self.pos = self.src[after + 1..]
                            .find(&closing)
                            .map_or(self.src.len(), |n| after + 1 + n + closing.len());
                        None
                    }
                    Some(b) if word == "r" && hashes == 1 && is_ident_start(b) => {
                        self.pos = self.ident_end(after);
                        Some(Token::Ident(&self.src[after..self.pos]))
                    }
                    _ => Some(Token::Ident(word)),
                }
            }
            ("b" | "c", Some(b'"')) => {
                self.pos += 1;
                self.quoted(b'"');
                None
            }
            ("b", Some(b'\'')) => {
                self.pos += 1;
                self.quoted(b'\'');
                None
            }
            _ => Some(Token::Ident(word)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Token::*, *};

    #[test]
    fn drops_comments_and_literals() {
        let src = r###"
            // use crate::a;
            /* crate::b /* nested */ crate::c */
            /// [`crate::d`]
            let s = "crate::e \" crate::f";
            let r = r#"crate::g "quoted" "#;
            let b = b"crate::h";
            let q = '"';
            let e = '\'';
            fn f<'a>(x: &'a str) -> char { 'z' }
            x::y
        "###;
        let idents: Vec<&str> = tokenize(src)
            .into_iter()
            .filter_map(|t| match t {
                Ident(i) => Some(i),
                _ => None,
            })
            .collect();
        assert_eq!(
            idents,
            [
                "let", "s", "let", "r", "let", "b", "let", "q", "let", "e", "fn", "f", "a", "x",
                "a", "str", "char", "x", "y"
            ]
        );
    }

    #[test]
    fn path_separators_and_raw_identifiers() {
        assert_eq!(
            tokenize("crate::r#type::{a, *};"),
            [
                Ident("crate"),
                PathSep,
                Ident("type"),
                PathSep,
                Punct('{'),
                Ident("a"),
                Punct(','),
                Punct('*'),
                Punct('}'),
                Punct(';'),
            ]
        );
    }
}
