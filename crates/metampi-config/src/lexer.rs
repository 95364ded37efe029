//! Tokens of the description language.
//!
//! Words are deliberately loose (`p4-00`, `192.168.0.1`, `/usr/bin/x`, `100Mbit/s`,
//! `p3-|01|`): the parser decides from context what a word means. Newlines are tokens
//! because the `NUMHOSTS` header and the router lines of a PAIR are line oriented; a
//! backslash at the end of a line joins it with the next (Fig. 4 of the paper).

use crate::error::{ErrorKind, Pos};

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Tok {
    /// A word; the text is in `Token::text`.
    Word,
    /// A quoted string; the unescaped content is in `Token::text`.
    Str,
    Eq,
    Comma,
    Semi,
    Colon,
    LBrace,
    RBrace,
    LParen,
    RParen,
    Bang,
    /// A lone `-` (node ranges, "no router executable").
    Minus,
    /// `->`
    Arrow,
    /// `<->`
    BiArrow,
    Newline,
    Eof,
}

#[derive(Debug, Clone)]
pub(crate) struct Token {
    pub kind: Tok,
    pub text: String,
    pub pos: Pos,
    /// Byte offsets into the source, for raw-text values.
    pub start: usize,
    pub end: usize,
}

impl Token {
    pub(crate) fn is_word(&self, w: &str) -> bool {
        self.kind == Tok::Word && self.text == w
    }

    /// How the token reads in an error message.
    pub(crate) fn describe(&self) -> String {
        match self.kind {
            Tok::Word => format!("'{}'", self.text),
            Tok::Str => format!("string {:?}", self.text),
            Tok::Eq => "'='".into(),
            Tok::Comma => "','".into(),
            Tok::Semi => "';'".into(),
            Tok::Colon => "':'".into(),
            Tok::LBrace => "'{'".into(),
            Tok::RBrace => "'}'".into(),
            Tok::LParen => "'('".into(),
            Tok::RParen => "')'".into(),
            Tok::Bang => "'!'".into(),
            Tok::Minus => "'-'".into(),
            Tok::Arrow => "'->'".into(),
            Tok::BiArrow => "'<->'".into(),
            Tok::Newline => "end of line".into(),
            Tok::Eof => "end of file".into(),
        }
    }
}

pub(crate) fn is_word_char(c: char) -> bool {
    c.is_alphanumeric()
        || matches!(
            c,
            '_' | '.' | '-' | '|' | '*' | '@' | '/' | '~' | '+' | '$' | '%'
        )
}

/// Splits `src` into tokens; the last token is always `Eof`.
pub(crate) fn lex(src: &str) -> Result<Vec<Token>, (Pos, ErrorKind)> {
    let mut lx = Lexer {
        src,
        chars: src.char_indices().peekable(),
        line: 1,
        col: 1,
        toks: Vec::new(),
    };
    lx.run()?;
    Ok(lx.toks)
}

struct Lexer<'a> {
    src: &'a str,
    chars: std::iter::Peekable<std::str::CharIndices<'a>>,
    line: u32,
    col: u32,
    toks: Vec<Token>,
}

impl Lexer<'_> {
    fn bump(&mut self) -> Option<(usize, char)> {
        let (i, c) = self.chars.next()?;
        if c == '\n' {
            self.line = self.line.saturating_add(1);
            self.col = 1;
        } else {
            self.col = self.col.saturating_add(1);
        }
        Some((i, c))
    }

    fn peek(&mut self) -> Option<char> {
        self.chars.peek().map(|&(_, c)| c)
    }

    fn peek2(&self) -> Option<char> {
        let mut it = self.chars.clone();
        it.next();
        it.next().map(|(_, c)| c)
    }

    fn offset(&mut self) -> usize {
        self.chars.peek().map_or(self.src.len(), |&(i, _)| i)
    }

    fn push(&mut self, kind: Tok, text: String, pos: Pos, start: usize) {
        let end = self.offset();
        self.toks.push(Token {
            kind,
            text,
            pos,
            start,
            end,
        });
    }

    fn run(&mut self) -> Result<(), (Pos, ErrorKind)> {
        while let Some(c) = self.peek() {
            let pos = Pos::new(self.line, self.col);
            let start = self.offset();
            match c {
                '\n' => {
                    self.bump();
                    self.push(Tok::Newline, String::new(), pos, start);
                }
                c if c.is_whitespace() => {
                    self.bump();
                }
                '#' => self.skip_comment(),
                '/' if self.peek2() == Some('*') => self.skip_block_comment(pos)?,
                '\\' => self.continuation(pos)?,
                '"' | '\'' => self.string(c, pos, start)?,
                '=' | ',' | ';' | ':' | '{' | '}' | '(' | ')' | '!' => {
                    self.bump();
                    let kind = match c {
                        '=' => Tok::Eq,
                        ',' => Tok::Comma,
                        ';' => Tok::Semi,
                        ':' => Tok::Colon,
                        '{' => Tok::LBrace,
                        '}' => Tok::RBrace,
                        '(' => Tok::LParen,
                        ')' => Tok::RParen,
                        _ => Tok::Bang,
                    };
                    self.push(kind, String::new(), pos, start);
                }
                '-' => {
                    self.bump();
                    if self.peek() == Some('>') {
                        self.bump();
                        self.push(Tok::Arrow, String::new(), pos, start);
                    } else {
                        self.push(Tok::Minus, String::new(), pos, start);
                    }
                }
                '<' => {
                    self.bump();
                    if self.peek() == Some('-') && self.peek2() == Some('>') {
                        self.bump();
                        self.bump();
                        self.push(Tok::BiArrow, String::new(), pos, start);
                    } else {
                        return Err((pos, ErrorKind::UnexpectedChar('<')));
                    }
                }
                '[' => self.bracketed(pos, start)?,
                c if is_word_char(c) => self.word(pos, start),
                c => return Err((pos, ErrorKind::UnexpectedChar(c))),
            }
        }
        let end = self.src.len();
        self.toks.push(Token {
            kind: Tok::Eof,
            text: String::new(),
            pos: Pos::new(self.line, self.col),
            start: end,
            end,
        });
        Ok(())
    }

    fn skip_comment(&mut self) {
        while let Some(c) = self.peek() {
            if c == '\n' {
                break;
            }
            self.bump();
        }
    }

    fn skip_block_comment(&mut self, pos: Pos) -> Result<(), (Pos, ErrorKind)> {
        self.bump();
        self.bump();
        loop {
            match self.bump() {
                Some((_, '*')) if self.peek() == Some('/') => {
                    self.bump();
                    return Ok(());
                }
                Some(_) => {}
                None => {
                    return Err((
                        pos,
                        ErrorKind::Expected {
                            expected: "'*/' to close the comment".into(),
                            found: "end of file".into(),
                        },
                    ))
                }
            }
        }
    }

    /// `\` then optional blanks/comment then newline: the line goes on.
    fn continuation(&mut self, pos: Pos) -> Result<(), (Pos, ErrorKind)> {
        self.bump();
        while let Some(c) = self.peek() {
            match c {
                '\n' => {
                    self.bump();
                    return Ok(());
                }
                '#' => self.skip_comment(),
                c if c.is_whitespace() => {
                    self.bump();
                }
                _ => break,
            }
        }
        if self.peek().is_none() {
            return Ok(());
        }
        Err((
            pos,
            ErrorKind::Expected {
                expected: "end of line after '\\' (a backslash continues the line)".into(),
                found: self
                    .peek()
                    .map_or_else(|| "end of file".into(), |c| format!("{c:?}")),
            },
        ))
    }

    fn string(&mut self, quote: char, pos: Pos, start: usize) -> Result<(), (Pos, ErrorKind)> {
        self.bump();
        let mut text = String::new();
        loop {
            match self.peek() {
                None | Some('\n') => return Err((pos, ErrorKind::UnterminatedString(quote))),
                Some(c) if c == quote => {
                    self.bump();
                    break;
                }
                // Double-quoted strings know `\"` and `\\`; single-quoted ones are literal,
                // as MetaMPICH's argument strings are.
                Some('\\') if quote == '"' => {
                    self.bump();
                    match self.peek() {
                        Some(c @ ('"' | '\\')) => {
                            self.bump();
                            text.push(c);
                        }
                        _ => text.push('\\'),
                    }
                }
                Some(c) => {
                    self.bump();
                    text.push(c);
                }
            }
        }
        self.push(Tok::Str, text, pos, start);
        Ok(())
    }

    /// `[v6 address]` is one word, brackets included.
    fn bracketed(&mut self, pos: Pos, start: usize) -> Result<(), (Pos, ErrorKind)> {
        let mut text = String::new();
        loop {
            match self.peek() {
                None | Some('\n') => {
                    return Err((
                        pos,
                        ErrorKind::Expected {
                            expected: "']' to close the bracketed address".into(),
                            found: "end of line".into(),
                        },
                    ))
                }
                Some(c) => {
                    self.bump();
                    text.push(c);
                    if c == ']' {
                        break;
                    }
                }
            }
        }
        self.push(Tok::Word, text, pos, start);
        Ok(())
    }

    fn word(&mut self, pos: Pos, start: usize) {
        let mut text = String::new();
        while let Some(c) = self.peek() {
            if !is_word_char(c) || (c == '-' && self.peek2() == Some('>')) {
                break;
            }
            self.bump();
            text.push(c);
        }
        self.push(Tok::Word, text, pos, start);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds(s: &str) -> Vec<(Tok, String)> {
        lex(s)
            .expect("lexes")
            .into_iter()
            .map(|t| (t.kind, t.text))
            .collect()
    }

    #[test]
    fn words_and_arrows() {
        let t = kinds("p4-00 - p4-63, a->b <-> c:1");
        let w = |s: &str| (Tok::Word, s.to_owned());
        let p = |k: Tok| (k, String::new());
        assert_eq!(
            t,
            vec![
                w("p4-00"),
                p(Tok::Minus),
                w("p4-63"),
                p(Tok::Comma),
                w("a"),
                p(Tok::Arrow),
                w("b"),
                p(Tok::BiArrow),
                w("c"),
                p(Tok::Colon),
                w("1"),
                p(Tok::Eof),
            ]
        );
    }

    #[test]
    fn continuation_and_comments() {
        let t = kinds("a -> b \\ # more\n  c -> d\n# x\ne");
        let n = t.iter().filter(|(k, _)| *k == Tok::Newline).count();
        assert_eq!(n, 2);
    }

    #[test]
    fn positions_count_characters() {
        let toks = lex("µ x\n\tyy").expect("lexes");
        assert_eq!(toks[1].pos, Pos::new(1, 3));
        assert_eq!(toks[3].pos, Pos::new(2, 2));
    }

    #[test]
    fn strings() {
        let t = kinds(r#""a \"b\" {cmd}" 'x\y'"#);
        assert_eq!(t[0], (Tok::Str, "a \"b\" {cmd}".into()));
        assert_eq!(t[1], (Tok::Str, "x\\y".into()));
        assert!(lex("\"abc\nd\"").is_err());
        assert!(lex("<-").is_err());
        assert!(lex("a \\ b").is_err());
    }
}
