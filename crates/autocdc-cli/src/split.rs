//! Splitting SQL text into statements.
//!
//! Statements end at a `;` that is not inside a single-quoted string (an
//! `E'…'` string's `\'` included), a dollar-quoted string (`$$…$$`,
//! `$tag$…$tag$`), a double-quoted or backtick-quoted identifier, a `--` line
//! comment or a `/* */` block comment (which may nest) — or, in the dialects
//! that read `#` as one (MySQL, BigQuery, Hive, Snowflake), a `#` line
//! comment.
//! Comments are removed from the returned statements (a block comment becomes a
//! space), so a statement can be recognised by its first keyword.

/// Where the scanner is in the text.
#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    /// Plain SQL.
    Code,
    /// Inside a quoted string or identifier closed by the given character.
    Quoted(char),
    /// Inside an `E'…'` string, where a backslash escapes the next character.
    Escaped,
    /// Inside a dollar-quoted string closed by this tag (`$$`, `$tag$`).
    Dollar(String),
    /// Inside a `--` comment (until the end of the line).
    LineComment,
    /// Inside `/* */` comments nested this deep (`/* a /* b */ c */` is
    /// one comment, as the SQL parsers read it).
    BlockComment(usize),
}

/// The result of [`split_statements`].
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Split {
    /// The complete (`;`-terminated) statements, without the `;`, comments and
    /// surrounding whitespace. Empty statements are left out.
    pub statements: Vec<String>,
    /// The text after the last complete statement, when it holds the start of another
    /// statement (SQL, or an unterminated quote or block comment); comments removed.
    pub pending: Option<String>,
    /// Byte offset in the input where the text after the last complete statement
    /// starts (just after its `;`), to keep that text verbatim.
    pub rest: usize,
    /// Whether the text ends inside a quoted string or identifier or a block
    /// comment (a next line continues it).
    pub open: bool,
    /// Whether it ends inside a block comment.
    pub open_comment: bool,
    /// Byte offset just after each complete statement's `;`.
    pub ends: Vec<usize>,
}

/// Whether `dialect` (a `datafusion.sql_parser.dialect` value) reads `#` as
/// the start of a line comment, as sqlparser's tokenizer does.
pub fn hash_comments(dialect: &str) -> bool {
    ["mysql", "bigquery", "hive", "snowflake"]
        .iter()
        .any(|d| dialect.eq_ignore_ascii_case(d))
}

/// Splits `text` into statements (see the [module docs](self)), `#` not
/// starting a comment.
#[cfg(test)]
fn split_statements(text: &str) -> Split {
    split_statements_in(text, false)
}

/// Splits `text` into statements, `#` starting a line comment when
/// `hash_comments`.
pub fn split_statements_in(text: &str, hash_comments: bool) -> Split {
    let mut split = Split::default();
    let mut current = String::new();
    let mut has_sql = false;
    let mut state = State::Code;
    let mut chars = text.char_indices().peekable();

    while let Some((index, c)) = chars.next() {
        match &state {
            State::Code => match c {
                ';' => {
                    if has_sql {
                        split.statements.push(current.trim().to_string());
                        split.ends.push(index + c.len_utf8());
                    }
                    current.clear();
                    has_sql = false;
                    split.rest = index + c.len_utf8();
                }
                '-' if next_is(&mut chars, '-') => {
                    chars.next();
                    state = State::LineComment;
                }
                '#' if hash_comments => state = State::LineComment,
                '/' if next_is(&mut chars, '*') => {
                    chars.next();
                    current.push(' ');
                    state = State::BlockComment(1);
                }
                'E' | 'e'
                    if next_is(&mut chars, '\'')
                        && !current.ends_with(|p: char| p.is_alphanumeric() || p == '_') =>
                {
                    current.push(c);
                    if let Some((_, quote)) = chars.next() {
                        current.push(quote);
                    }
                    has_sql = true;
                    state = State::Escaped;
                }
                '$' if !current.ends_with(|p: char| p.is_alphanumeric() || p == '_') => {
                    current.push(c);
                    has_sql = true;
                    if let Some(tag) = dollar_tag(&text[index..]) {
                        // (the opening tag's other characters)
                        for _ in 1..tag.len() {
                            if let Some((_, t)) = chars.next() {
                                current.push(t);
                            }
                        }
                        state = State::Dollar(tag);
                    }
                }
                '\'' | '"' | '`' => {
                    current.push(c);
                    has_sql = true;
                    state = State::Quoted(c);
                }
                _ => {
                    current.push(c);
                    has_sql |= !c.is_whitespace();
                }
            },
            State::Quoted(close) => {
                // A doubled quote ('it''s') closes and reopens: same result.
                current.push(c);
                if c == *close {
                    state = State::Code;
                }
            }
            State::Escaped => {
                current.push(c);
                match c {
                    '\\' => {
                        if let Some((_, escaped)) = chars.next() {
                            current.push(escaped);
                        }
                    }
                    '\'' => state = State::Code,
                    _ => {}
                }
            }
            State::Dollar(tag) => {
                current.push(c);
                if c == '$' && text[index..].starts_with(tag.as_str()) {
                    for _ in 1..tag.len() {
                        if let Some((_, t)) = chars.next() {
                            current.push(t);
                        }
                    }
                    state = State::Code;
                }
            }
            State::LineComment => {
                if c == '\n' {
                    current.push(c);
                    state = State::Code;
                }
            }
            State::BlockComment(depth) => {
                if c == '*' && next_is(&mut chars, '/') {
                    chars.next();
                    state = match depth {
                        1 => State::Code,
                        _ => State::BlockComment(depth - 1),
                    };
                } else if c == '/' && next_is(&mut chars, '*') {
                    chars.next();
                    state = State::BlockComment(depth + 1);
                }
            }
        }
    }

    let unterminated = !matches!(state, State::Code | State::LineComment);
    split.open = unterminated;
    split.open_comment = matches!(state, State::BlockComment(_));
    if has_sql || unterminated {
        split.pending = Some(current.trim().to_string());
    }
    split
}

/// The opening tag of a dollar-quoted string at the start of `text` (`$$`,
/// `$tag$`: letters, digits and `_`, not starting with a digit), if any.
fn dollar_tag(text: &str) -> Option<String> {
    let rest = text.strip_prefix('$')?;
    let end = rest.find('$')?;
    let tag = &rest[..end];
    let valid = tag.chars().all(|c| c.is_alphanumeric() || c == '_')
        && !tag.starts_with(|c: char| c.is_ascii_digit());
    valid.then(|| format!("${tag}$"))
}

/// Whether the next character is `expected`.
fn next_is(chars: &mut std::iter::Peekable<std::str::CharIndices<'_>>, expected: char) -> bool {
    chars.peek().is_some_and(|&(_, c)| c == expected)
}

/// All statements of a script: the complete ones and a final one that lacks
/// its `;`.
#[cfg(test)]
fn script_statements(text: &str) -> Vec<String> {
    script_statements_in(text, false)
}

/// All statements of a script, `#` starting a comment when `hash_comments`.
pub fn script_statements_in(text: &str, hash_comments: bool) -> Vec<String> {
    let Split {
        mut statements,
        pending,
        ..
    } = split_statements_in(text, hash_comments);
    statements.extend(pending.filter(|sql| !sql.is_empty()));
    statements
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_on_semicolons() {
        assert_eq!(
            script_statements("SELECT 1; SELECT 2;\n SELECT 3"),
            ["SELECT 1", "SELECT 2", "SELECT 3"]
        );
    }

    #[test]
    fn ignores_semicolons_in_quotes() {
        assert_eq!(
            script_statements(r#"SELECT 'a;b', "c;d", `e;f`, 'it''s;'; SELECT 2"#),
            [r#"SELECT 'a;b', "c;d", `e;f`, 'it''s;'"#, "SELECT 2"]
        );
    }

    #[test]
    fn ignores_semicolons_and_comment_marks_in_dollar_and_escaped_strings() {
        assert_eq!(
            script_statements("SELECT $$a -- b;$$ AS x; SELECT $t$it's; $$ $t$; SELECT 2"),
            [
                "SELECT $$a -- b;$$ AS x",
                "SELECT $t$it's; $$ $t$",
                "SELECT 2"
            ]
        );
        assert_eq!(
            script_statements(r"SELECT E'It\'s; /*' AS x; SELECT e'\\'; SELECT 2"),
            [r"SELECT E'It\'s; /*' AS x", r"SELECT e'\\'", "SELECT 2"]
        );
        // a name ending in e, a parameter, a column named like a tag: plain SQL
        assert_eq!(
            script_statements("SELECT name'x' FROM t WHERE a = $1; SELECT b$c$ FROM t; SELECT 3"),
            [
                "SELECT name'x' FROM t WHERE a = $1",
                "SELECT b$c$ FROM t",
                "SELECT 3"
            ]
        );
        assert!(split_statements("SELECT $$open;").pending.is_some());
    }

    #[test]
    fn removes_comments() {
        assert_eq!(
            script_statements("-- first; not a statement\nSELECT 1 /* ; */ + 1; -- done;\n;"),
            ["SELECT 1   + 1"]
        );
    }

    #[test]
    fn reports_pending_text() {
        let split = split_statements("SELECT 1;\nSELECT");
        assert_eq!(split.statements, ["SELECT 1"]);
        assert_eq!(split.pending.as_deref(), Some("SELECT"));
        assert_eq!(split.rest, "SELECT 1;".len());

        assert_eq!(split_statements("SELECT 1; -- c\n").pending, None);
        assert!(split_statements("SELECT 'a;\n").pending.is_some());
        assert!(split_statements("/* open\n").pending.is_some());
        // nested: one comment, the DELETE in it no statement
        assert_eq!(
            script_statements("/* off: /* old */\nDELETE FROM t;\n*/ SELECT 1;"),
            ["SELECT 1"]
        );
        assert!(split_statements("/* a /* b */ c\n").open_comment);
        // `#` comments where the dialect has them
        let hashed = "SELECT 1 # off; DELETE FROM t\n; SELECT 2;";
        assert_eq!(
            split_statements_in(hashed, true).statements,
            ["SELECT 1", "SELECT 2"]
        );
        assert_eq!(
            split_statements_in(hashed, true).ends,
            [hashed.len() - 10, hashed.len()]
        );
        assert_eq!(split_statements(hashed).statements.len(), 3);
    }
}
