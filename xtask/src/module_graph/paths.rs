//! The paths inside its own crate that a module's source names: every leaf
//! of its `use` trees and every `crate::…` and `super::…` path in code
//! (macro arguments included), made absolute from the crate root.
//! `#[cfg(test)] mod … { … }` blocks are left out: tests may reach anywhere.

use super::tokens::{Token, tokenize};

/// `module` is the module's path from the crate root (empty for the root).
pub fn referenced(source: &str, module: &[&str]) -> Vec<Vec<String>> {
    let mut scan = Scan {
        tokens: tokenize(source),
        pos: 0,
        leaves: Vec::new(),
    };
    let mut out = Vec::new();
    // Inline modules the scan is in, with the brace depth their body opens.
    let mut inline: Vec<(&str, usize)> = Vec::new();
    let mut depth = 0;
    while let Some(token) = scan.peek(0) {
        match token {
            Token::Punct('#') if scan.is_cfg_test() => {
                scan.skip_test_module();
                continue;
            }
            Token::Punct('{') => depth += 1,
            Token::Punct('}') => {
                if inline.last().is_some_and(|&(_, d)| d == depth) {
                    inline.pop();
                }
                depth = depth.saturating_sub(1);
            }
            Token::Ident("mod") => {
                if let (Some(Token::Ident(name)), Some(Token::Punct('{'))) =
                    (scan.peek(1), scan.peek(2))
                {
                    inline.push((name, depth + 1));
                }
            }
            // `use<'a>` after `impl Trait` captures lifetimes; it is no import.
            Token::Ident("use") if scan.peek(1) != Some(Token::Punct('<')) => {
                scan.pos += 1;
                scan.use_tree(Vec::new());
                let here = within(module, &inline);
                for leaf in std::mem::take(&mut scan.leaves) {
                    out.extend(absolute(&leaf, &here));
                }
                continue;
            }
            Token::Ident(first @ ("crate" | "super"))
                if scan.peek(1) == Some(Token::PathSep)
                    && scan.pos.checked_sub(1).and_then(|p| scan.tokens.get(p))
                        != Some(&Token::PathSep) =>
            {
                let mut path = vec![first];
                while let (Some(Token::PathSep), Some(Token::Ident(segment))) =
                    (scan.peek(1), scan.peek(2))
                {
                    path.push(segment);
                    scan.pos += 2;
                }
                out.extend(absolute(&path, &within(module, &inline)));
            }
            _ => {}
        }
        scan.pos += 1;
    }
    out
}

/// The path of the innermost inline module the scan is in (`module` itself
/// outside any).
fn within<'a>(module: &[&'a str], inline: &[(&'a str, usize)]) -> Vec<&'a str> {
    let inline = inline.iter().map(|(name, _)| *name);
    module.iter().copied().chain(inline).collect()
}

/// A path as written, from module `here`, made absolute; `None` for one
/// that starts elsewhere (another crate, a local name).
fn absolute(path: &[&str], here: &[&str]) -> Option<Vec<String>> {
    let (base, rest): (&[&str], &[&str]) = match path.split_first()? {
        (&"crate", rest) => (&[], rest),
        (&"self", rest) => (here, rest),
        (&"super", mut rest) => {
            let mut base = here.split_last().map_or(here, |(_, parent)| parent);
            while let Some((&"super", further)) = rest.split_first() {
                base = base.split_last().map_or(base, |(_, parent)| parent);
                rest = further;
            }
            (base, rest)
        }
        _ => return None,
    };
    Some(base.iter().chain(rest).map(|s| s.to_string()).collect())
}

struct Scan<'a> {
    tokens: Vec<Token<'a>>,
    pos: usize,
    /// Leaves of the use tree being read, as written.
    leaves: Vec<Vec<&'a str>>,
}

impl<'a> Scan<'a> {
    fn peek(&self, ahead: usize) -> Option<Token<'a>> {
        self.tokens.get(self.pos + ahead).copied()
    }

    fn is_cfg_test(&self) -> bool {
        let cfg_test = [
            Token::Punct('#'),
            Token::Punct('['),
            Token::Ident("cfg"),
            Token::Punct('('),
            Token::Ident("test"),
            Token::Punct(')'),
            Token::Punct(']'),
        ];
        self.tokens[self.pos..].starts_with(&cfg_test)
    }

    /// At `#[cfg(test)]`: past it, and past the module it marks if that is
    /// an inline module (other attributes and a visibility may come between).
    fn skip_test_module(&mut self) {
        self.pos += 7;
        let mut at = self.pos;
        while self.tokens.get(at) == Some(&Token::Punct('#')) {
            at = self.past_group(at + 1, '[', ']');
        }
        if self.tokens.get(at) == Some(&Token::Ident("pub")) {
            at += 1;
            if self.tokens.get(at) == Some(&Token::Punct('(')) {
                at = self.past_group(at, '(', ')');
            }
        }
        if let (Some(Token::Ident("mod")), Some(Token::Ident(_)), Some(Token::Punct('{'))) = (
            self.tokens.get(at),
            self.tokens.get(at + 1),
            self.tokens.get(at + 2),
        ) {
            self.pos = self.past_group(at + 2, '{', '}');
        }
    }

    /// The position after the group that opens at `at` (where `open` must
    /// be); `at` itself if it does not open one.
    fn past_group(&self, at: usize, open: char, close: char) -> usize {
        if self.tokens.get(at) != Some(&Token::Punct(open)) {
            return at;
        }
        let mut depth = 0;
        for (i, token) in self.tokens.iter().enumerate().skip(at) {
            if *token == Token::Punct(open) {
                depth += 1;
            } else if *token == Token::Punct(close) {
                depth -= 1;
                if depth == 0 {
                    return i + 1;
                }
            }
        }
        self.tokens.len()
    }

    /// Reads one use tree below `prefix` into `leaves`: `a::b`, `a::*`,
    /// `a::{b, c::{d, self}}`, `a as b`.
    fn use_tree(&mut self, mut prefix: Vec<&'a str>) {
        if self.peek(0) == Some(Token::PathSep) {
            // `::name` names another crate.
            prefix.push("::");
            self.pos += 1;
        }
        loop {
            match self.peek(0) {
                Some(Token::Ident(name)) if name != "as" => {
                    self.pos += 1;
                    if self.peek(0) == Some(Token::PathSep) {
                        prefix.push(name);
                        self.pos += 1;
                        continue;
                    }
                    // `a::{self}` is `a`.
                    if name != "self" || prefix.is_empty() {
                        prefix.push(name);
                    }
                    self.leaves.push(prefix);
                }
                Some(Token::Punct('*')) => {
                    self.pos += 1;
                    self.leaves.push(prefix);
                }
                Some(Token::Punct('{')) => {
                    self.pos += 1;
                    loop {
                        match self.peek(0) {
                            None => break,
                            Some(Token::Punct('}')) => {
                                self.pos += 1;
                                break;
                            }
                            Some(Token::Punct(',')) => self.pos += 1,
                            Some(_) => {
                                let before = self.pos;
                                self.use_tree(prefix.clone());
                                if self.pos == before {
                                    // Not a use tree (a `use` inside a macro's
                                    // own syntax): step over it.
                                    self.pos += 1;
                                }
                            }
                        }
                    }
                }
                _ => {}
            }
            break;
        }
        if self.peek(0) == Some(Token::Ident("as")) {
            self.pos += 2;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paths(source: &str, module: &[&str]) -> Vec<String> {
        let mut out: Vec<String> = referenced(source, module)
            .into_iter()
            .map(|p| p.join("::"))
            .collect();
        out.sort();
        out.dedup();
        out
    }

    #[test]
    fn expands_nested_use_trees() {
        let src = "use crate::{a::{b, c::{self, D as E}}, f::*, g};\n\
                   pub(crate) use self::h::I;\n\
                   use std::{fmt, io};\n\
                   use ::other::thing;";
        assert_eq!(
            paths(src, &["m"]),
            ["a::b", "a::c", "a::c::D", "f", "g", "m::h::I"]
        );
    }

    #[test]
    fn resolves_super_from_the_module() {
        let src = "use super::x::Y;\n\
                   use super::super::z;\n\
                   fn f() { super::w::run(); crate::v::go::<u8>(); }";
        assert_eq!(
            paths(src, &["a", "b", "c"]),
            ["a::b::w::run", "a::b::x::Y", "a::z", "v::go"]
        );
    }

    #[test]
    fn paths_in_code_and_macros_count_but_not_comments_or_strings() {
        let src = "// crate::commented\n\
                   /// [`crate::documented`]\n\
                   fn f() -> crate::ty::T {\n\
                       println!(\"crate::quoted {}\", crate::in_macro::value());\n\
                       other::crate_like::x();\n\
                   }";
        assert_eq!(paths(src, &["m"]), ["in_macro::value", "ty::T"]);
    }

    #[test]
    fn test_modules_are_ignored() {
        let src = "use crate::kept;\n\
                   #[cfg(test)]\n\
                   #[allow(dead_code)]\n\
                   pub(crate) mod tests {\n\
                       use super::*;\n\
                       use crate::only_in_tests;\n\
                       fn f() { let _ = { crate::nested_block::x() }; }\n\
                   }\n\
                   #[cfg(test)]\n\
                   fn helper() -> crate::test_helper::H { todo!() }\n\
                   fn after() { crate::after_tests::y(); }";
        // Only inline test modules are skipped; a test-only item elsewhere
        // still counts.
        assert_eq!(
            paths(src, &["m"]),
            ["after_tests::y", "kept", "test_helper::H"]
        );
    }

    #[test]
    fn super_inside_an_inline_module_is_the_file_module() {
        let src = "mod user { use super::Record; fn f() { super::super::up::go(); } }\n\
                   use super::after::Z;";
        assert_eq!(
            paths(src, &["a", "b"]),
            ["a::after::Z", "a::b::Record", "a::up::go"]
        );
    }

    #[test]
    fn precise_capture_is_no_import() {
        let src =
            "fn f<'a>(x: &'a str) -> impl Iterator<Item = u8> + use<'a> { crate::it::make(x) }";
        assert_eq!(paths(src, &[]), ["it::make"]);
    }
}
