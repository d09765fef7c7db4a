//! `CdcParser`: recognises and parses the AUTO CDC statements with
//! sqlparser's tokenizer and expression/query parsers, under the session's
//! SQL dialect (so `"DELETE"` is a string under the Databricks dialect).

use std::ops::ControlFlow;

use datafusion::common::{DataFusionError, Result};
use datafusion::sql::sqlparser::ast::{
    Expr as SqlExpr, FunctionArg, FunctionArgExpr, FunctionArguments, Ident, ObjectName,
};
use datafusion::sql::sqlparser::dialect::{dialect_from_str, Dialect};
use datafusion::sql::sqlparser::keywords::{self, Keyword};
use datafusion::sql::sqlparser::parser::Parser;
use datafusion::sql::sqlparser::tokenizer::{Location, Token, TokenWithSpan, Tokenizer};

use crate::spec::expectations::{Expectation, OnViolation};
use crate::spec::{ColumnSelection, FlowSource, FlowSpec, ScdType, SequenceBy, StreamRead};
use crate::table::TableName;

/// `CREATE [OR REFRESH] STREAMING TABLE`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreateStreamingTable {
    /// Table name.
    pub name: TableName,
    /// `OR REFRESH`: an existing table is kept.
    pub or_refresh: bool,
    /// `IF NOT EXISTS`.
    pub if_not_exists: bool,
    /// Declared columns: name and SQL type text (in `dialect`).
    pub columns: Vec<(String, String)>,
    /// `TBLPROPERTIES`.
    pub properties: Vec<(String, String)>,
    /// Dialect of the type texts.
    pub dialect: String,
    /// `AS query`: the query of the table's append flow (named after the
    /// table).
    pub query: Option<String>,
    /// `FLOW AUTO CDC [ONCE] FROM …`: the table's AUTO CDC flow (named after
    /// the table).
    pub flow: Option<Box<FlowSpec>>,
    /// `CONSTRAINT name EXPECT (condition) [ON VIOLATION …]` among the
    /// columns.
    pub expectations: Vec<Expectation>,
    /// `COMMENT '…'`: the table's description.
    pub comment: Option<String>,
}

/// `MERGE INTO target USING source ON condition WHEN ...`, its parts as SQL
/// text in the statement's dialect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MergeStatement {
    /// The target streaming table.
    pub target: TableName,
    /// The name its columns are qualified with (its alias, or its name).
    pub target_alias: String,
    /// The source relation as written (`src AS s`, `(SELECT ...) AS s`).
    pub source: String,
    /// The `ON` condition.
    pub on: String,
    /// The `WHEN` clauses, in order.
    pub clauses: Vec<MergeClause>,
    /// Dialect of the texts.
    pub dialect: String,
}

/// One `WHEN` clause of a `MERGE`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MergeClause {
    /// `WHEN MATCHED` (else `WHEN NOT MATCHED`).
    pub matched: bool,
    /// `AND condition`.
    pub condition: Option<String>,
    /// What it does.
    pub action: MergeAction,
}

/// The action of a `MERGE` clause.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MergeAction {
    /// `UPDATE SET column = expression, ...`.
    Update(Vec<(String, String)>),
    /// `DELETE`.
    Delete,
    /// `INSERT [(columns)] VALUES (expressions)` (no columns: all, in order).
    Insert {
        /// The columns given.
        columns: Vec<String>,
        /// Their values.
        values: Vec<String>,
    },
}

/// The version a `RESTORE` names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RestoreTo {
    /// `VERSION AS OF n`: a commit version.
    Version(u64),
    /// `TIMESTAMP AS OF 'ts'`: the newest commit made at or before it (as
    /// written; converted like a `TIMESTAMP` literal).
    Timestamp(String),
}

/// Which tables of a pipeline update start from scratch.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum FullRefresh {
    /// None: every table reads what is new.
    #[default]
    None,
    /// `FULL`: every table.
    All,
    /// `FULL (t, ...)`: these tables and every table that reads them.
    Tables(Vec<TableName>),
}

/// A statement of ours.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CdcStatement {
    /// `REFRESH PIPELINE [schema] [FULL [(t, ...)]]`: every streaming table
    /// (of the schema) updated once, in dependency order.
    RefreshPipeline {
        /// Only this schema's tables.
        schema: Option<String>,
        /// What starts from scratch.
        full: FullRefresh,
    },
    /// `CREATE [OR REFRESH] STREAMING TABLE`.
    CreateStreamingTable(CreateStreamingTable),
    /// `CREATE FLOW ... AS AUTO CDC INTO` / `APPLY CHANGES INTO`.
    CreateFlow(Box<FlowSpec>),
    /// `REFRESH STREAMING TABLE name [FULL]`.
    Refresh {
        /// Table.
        name: TableName,
        /// `FULL`.
        full: bool,
    },
    /// `RESTORE [STREAMING] [TABLE] name [TO] {VERSION | TIMESTAMP} AS OF x`.
    Restore {
        /// Table.
        name: TableName,
        /// The version restored.
        to: RestoreTo,
    },
    /// `DROP STREAMING TABLE [IF EXISTS] name`.
    Drop {
        /// Table.
        name: TableName,
        /// `IF EXISTS`.
        if_exists: bool,
    },
    /// `DROP FLOW [IF EXISTS] name`.
    DropFlow {
        /// The flow (flows are named across the warehouse).
        name: String,
        /// `IF EXISTS`.
        if_exists: bool,
    },
    /// `MERGE INTO target USING source ON ... WHEN ...`.
    Merge(Box<MergeStatement>),
    /// `SHOW TBLPROPERTIES name [(key)]`.
    ShowProperties {
        /// Table.
        name: TableName,
        /// The one property asked for.
        key: Option<String>,
    },
    /// `EXPLAIN [ANALYZE] [VERBOSE] [FORMAT f] <statement>`.
    Explain {
        /// `ANALYZE`: run it and show metrics.
        analyze: bool,
        /// `VERBOSE`.
        verbose: bool,
        /// `FORMAT f` (`indent`, `tree`, `pgjson`, `graphviz`); without it
        /// the session's `datafusion.explain.format`.
        format: Option<String>,
        /// The explained statement.
        statement: Box<CdcStatement>,
    },
}

struct CdcParser<'a> {
    p: Parser<'a>,
    normalize: bool,
    dialect: String,
}

/// `factor` as SQL text that reads back as it: a versioned table (`t
/// VERSION AS OF 1 AS s`) with its version before its alias, which
/// sqlparser writes after it (`t AS s VERSION AS OF 1` reads as no table).
fn relation_text(factor: &datafusion::sql::sqlparser::ast::TableFactor) -> String {
    use datafusion::sql::sqlparser::ast::TableFactor;
    match factor {
        TableFactor::Table {
            name,
            alias,
            version: Some(version),
            args: None,
            ..
        } => match alias {
            // (an alias writes its own `AS`)
            Some(alias) => format!("{name} {version} {alias}"),
            None => format!("{name} {version}"),
        },
        other => other.to_string(),
    }
}

/// Whether `expr` holds a subquery (`IN (SELECT …)`, `EXISTS`, a scalar
/// subquery), at any depth.
fn has_subquery(expr: &SqlExpr) -> bool {
    use datafusion::sql::sqlparser::ast::{Visit, Visitor};
    struct Finds;
    impl Visitor for Finds {
        type Break = ();
        fn pre_visit_expr(&mut self, expr: &SqlExpr) -> ControlFlow<()> {
            match expr {
                SqlExpr::Subquery(_) | SqlExpr::InSubquery { .. } | SqlExpr::Exists { .. } => {
                    ControlFlow::Break(())
                }
                _ => ControlFlow::Continue(()),
            }
        }
    }
    expr.visit(&mut Finds).is_break()
}

fn perr(msg: impl std::fmt::Display) -> DataFusionError {
    DataFusionError::SQL(
        Box::new(datafusion::sql::sqlparser::parser::ParserError::ParserError(msg.to_string())),
        None,
    )
}

/// Parse `sql` if it is one of our statements; `Ok(None)` hands it to DataFusion.
pub fn parse_cdc_statement(
    sql: &str,
    dialect: &str,
    normalize_idents: bool,
) -> Result<Option<CdcStatement>> {
    let d: Box<dyn Dialect> = dialect_from_str(dialect)
        .ok_or_else(|| DataFusionError::Plan(format!("unsupported SQL dialect '{dialect}'")))?;
    let parenthesised = parenthesised_streams(sql, d.as_ref());
    let sql = parenthesised.as_deref().unwrap_or(sql);
    let p = match Parser::new(d.as_ref()).try_with_sql(sql) {
        Ok(p) => p,
        // not tokenizable by us: let DataFusion report it
        Err(_) => return Ok(None),
    };
    let mut c = CdcParser {
        p,
        normalize: normalize_idents,
        dialect: dialect.to_string(),
    };
    c.statement(true)
        .map_err(|e| match has_relation(sql, d.as_ref()) {
            // (our statements take queries DataFusion's parser reads)
            true => e.context(
                "a query relation (AUTO CDC (…) or SNAPSHOTS (…)) is not read inside this \
             statement: define a view of the query holding it (CREATE VIEW v AS SELECT … \
             FROM AUTO CDC (…) …) and read the view",
            ),
            false => e,
        })
}

/// Whether `sql` has a query relation (`AUTO CDC (` or `SNAPSHOTS (` after
/// `FROM`, `JOIN` or `,`).
fn has_relation(sql: &str, dialect: &dyn Dialect) -> bool {
    let Ok(tokens) = Tokenizer::new(dialect, sql).tokenize() else {
        return false;
    };
    let words: Vec<&Token> = tokens
        .iter()
        .filter(|t| !matches!(t, Token::Whitespace(_)))
        .collect();
    words.windows(4).any(|w| {
        starts_relation(w[0])
            && ((is_word(w[1], "AUTO") && is_word(w[2], "CDC") && *w[3] == Token::LParen)
                || (is_word(w[1], "SNAPSHOTS") && *w[2] == Token::LParen))
    })
}

/// One `AUTO CDC (query) clauses…` relation of a query (SPEC §4.10).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AutoCdcRelation {
    /// Its clauses, as a flow's (the source: the query in parentheses).
    pub spec: FlowSpec,
    /// The query of its change events (or snapshots).
    pub query: String,
    /// `FROM SNAPSHOTS … VERSION BY v`: the query holds snapshots tagged by
    /// the column `v` (`None`: change events).
    pub snapshot_version: Option<String>,
    /// `WITH CHANGES`: the relation is the change feed the fold would write
    /// (its rows with `_change_type`), not the rows it leaves.
    pub changes: bool,
}

/// A query whose `AUTO CDC (…)` relations were replaced by names.
pub type ReplacedRelations = (String, Vec<(String, AutoCdcRelation)>);

/// `sql` with every relation `AUTO CDC (query) KEYS (…) …` (after `FROM`,
/// `JOIN` or `,`) replaced by a name from `name`, and the relations by
/// name; `None` when it has none.
pub fn replace_auto_cdc_relations(
    sql: &str,
    dialect: &str,
    normalize_idents: bool,
    mut name: impl FnMut() -> String,
) -> Result<Option<ReplacedRelations>> {
    let d: Box<dyn Dialect> = dialect_from_str(dialect)
        .ok_or_else(|| DataFusionError::Plan(format!("unsupported SQL dialect '{dialect}'")))?;
    let mut sql = sql.to_string();
    let mut found = Vec::new();
    // a relation without an alias is aliased after its kind (`auto_cdc`,
    // `snapshots`; numbered from the second on), so derived columns read
    // `max(auto_cdc.v)` whatever its internal name — a name the query
    // uses otherwise (a table `auto_cdc`, an alias `auto_cdc_2`) skipped
    // (names after FROM, JOIN, a comma or AS: tables and aliases; not a
    // qualifier, `auto_cdc.v`, nor a word before `(`: `SNAPSHOTS (…)`)
    let tokens: Vec<Token> = Tokenizer::new(d.as_ref(), &sql)
        .tokenize()
        .unwrap_or_default()
        .into_iter()
        .filter(|t| !matches!(t, Token::Whitespace(_)))
        .chain([Token::EOF])
        .collect();
    // (and an alias written without AS: a word that is no keyword after a
    // name or a closing parenthesis, `FROM e auto_cdc`; a column's alias so
    // written is skipped too, which costs nothing)
    let mut taken: std::collections::HashSet<String> = tokens
        .windows(3)
        .filter_map(|w| match (&w[0], &w[1], &w[2]) {
            (before, Token::Word(name), after)
                if (starts_relation(before)
                    || is_word(before, "AS")
                    || (matches!(before, Token::Word(_) | Token::RParen)
                        && name.keyword == Keyword::NoKeyword))
                    && !matches!(after, Token::LParen | Token::Period) =>
            {
                Some(name.value.to_lowercase())
            }
            _ => None,
        })
        .collect();
    let mut alias = |next: &Token, kind: usize| -> String {
        if has_alias(next) {
            return String::new();
        }
        let base = ["auto_cdc", "snapshots"][kind];
        let name = (1..)
            .map(|n| match n {
                1 => base.to_string(),
                n => format!("{base}_{n}"),
            })
            .find(|name| !taken.contains(name))
            .unwrap_or_else(|| base.to_string());
        taken.insert(name.clone());
        format!("AS {name} ")
    };
    loop {
        let Ok(tokens) = Tokenizer::new(d.as_ref(), &sql).tokenize_with_location() else {
            return Ok(None);
        };
        let words: Vec<&TokenWithSpan> = tokens
            .iter()
            .filter(|t| !matches!(t.token, Token::Whitespace(_)))
            .collect();
        let is_word = |t: &TokenWithSpan, w: &str| is_word(&t.token, w);
        let relation_at = |i: usize| starts_relation(&words[i - 1].token);
        // the last one first: a relation nested in another's query starts
        // after it, and is a name by the time the outer one is parsed
        let at = (1..words.len().saturating_sub(2)).rev().find(|&i| {
            relation_at(i)
                && ((is_word(words[i], "AUTO")
                    && is_word(words[i + 1], "CDC")
                    && words[i + 2].token == Token::LParen)
                    || (is_word(words[i], "SNAPSHOTS") && words[i + 1].token == Token::LParen))
        });
        let Some(at) = at else { break };
        let start = byte_offset(&sql, words[at].span.start);
        if is_word(words[at], "SNAPSHOTS") {
            let text = &sql[start..];
            let p = Parser::new(d.as_ref()).try_with_sql(text)?;
            let mut c = CdcParser {
                p,
                normalize: normalize_idents,
                dialect: dialect.to_string(),
            };
            let mut relation = c.snapshots_relation()?;
            relation.changes = c.with_changes();
            let next = c.p.peek_token();
            let end = match next.token {
                Token::EOF => sql.len(),
                _ => start + byte_offset(text, next.span.start),
            };
            let placeholder = name();
            let alias = alias(&next.token, 1);
            found.push((placeholder.clone(), relation));
            sql.replace_range(start..end, &format!("{placeholder} {alias}"));
            continue;
        }
        let open = byte_offset(&sql, words[at + 2].span.start);
        let text = format!("FROM {}", &sql[open..]);
        let p = Parser::new(d.as_ref()).try_with_sql(&text)?;
        let mut c = CdcParser {
            p,
            normalize: normalize_idents,
            dialect: dialect.to_string(),
        };
        let target = TableName::from_parts(&["auto_cdc".to_string()])?;
        let spec = c.flow_from("auto_cdc".to_string(), &target, false)?;
        let FlowSource::Query(query) = &spec.source else {
            return Err(perr("AUTO CDC (query): expected a query in parentheses"));
        };
        let changes = c.with_changes();
        let next = c.p.peek_token();
        let end = match next.token {
            Token::EOF => sql.len(),
            _ => open + byte_offset(&text, next.span.start) - "FROM ".len(),
        };
        let placeholder = name();
        let alias = alias(&next.token, 0);
        found.push((
            placeholder.clone(),
            AutoCdcRelation {
                query: query.clone(),
                spec,
                snapshot_version: None,
                changes,
            },
        ));
        sql.replace_range(start..end, &format!("{placeholder} {alias}"));
    }
    Ok((!found.is_empty()).then_some((sql, found)))
}

/// Whether the token after a relation starts its alias (`AS t`, `t`).
fn has_alias(next: &Token) -> bool {
    match next {
        Token::Word(w) => {
            w.keyword == Keyword::AS
                || w.quote_style.is_some()
                || !keywords::RESERVED_FOR_TABLE_ALIAS.contains(&w.keyword)
        }
        _ => false,
    }
}

/// `sql` with each stream of a qualified name, `STREAM schema.t` (after
/// `FROM`, `JOIN` or `,`), written `STREAM(schema.t)`: SQL parsers read
/// `STREAM schema` as a table aliased, then stop at the `.`; `None` when
/// it has none.
fn parenthesised_streams(sql: &str, dialect: &dyn Dialect) -> Option<String> {
    let tokens = Tokenizer::new(dialect, sql).tokenize_with_location().ok()?;
    let words: Vec<&TokenWithSpan> = tokens
        .iter()
        .filter(|t| !matches!(t.token, Token::Whitespace(_)))
        .collect();
    let is_word = |t: &TokenWithSpan, w: &str| is_word(&t.token, w);
    let is_name = |t: &TokenWithSpan| matches!(t.token, Token::Word(_));
    // (start of the name, end of its last part), first to last
    let mut names = Vec::new();
    let mut i = 1;
    while i + 3 < words.len() {
        let after = words[i - 1];
        let stream =
            (is_word(after, "FROM") || is_word(after, "JOIN") || after.token == Token::Comma)
                && is_word(words[i], "STREAM")
                && is_name(words[i + 1])
                && words[i + 2].token == Token::Period
                && is_name(words[i + 3]);
        if !stream {
            i += 1;
            continue;
        }
        let mut last = i + 3;
        while last + 2 < words.len()
            && words[last + 1].token == Token::Period
            && is_name(words[last + 2])
        {
            last += 2;
        }
        names.push((
            byte_offset(sql, words[i + 1].span.start),
            byte_offset(sql, words[last].span.end),
        ));
        i = last + 1;
    }
    if names.is_empty() {
        return None;
    }
    let mut sql = sql.to_string();
    for (start, end) in names.into_iter().rev() {
        sql.insert(end, ')');
        sql.insert(start, '(');
    }
    Some(sql)
}

/// Whether `token` is the unquoted word `w` (any case).
fn is_word(token: &Token, w: &str) -> bool {
    matches!(token, Token::Word(x) if x.quote_style.is_none() && x.value.eq_ignore_ascii_case(w))
}

/// Whether a relation may follow `token`: `FROM`, `JOIN` or `,`.
fn starts_relation(token: &Token) -> bool {
    is_word(token, "FROM") || is_word(token, "JOIN") || *token == Token::Comma
}

/// The byte offset of a tokenizer location (1-based line and character).
fn byte_offset(text: &str, location: Location) -> usize {
    let mut offset = 0;
    for (n, line) in text.split_inclusive('\n').enumerate() {
        if n + 1 == location.line as usize {
            return offset
                + line
                    .char_indices()
                    .nth(location.column.saturating_sub(1) as usize)
                    .map_or(line.len(), |(i, _)| i);
        }
        offset += line.len();
    }
    text.len()
}

impl CdcParser<'_> {
    fn peek_word(&self, n: usize, w: &str) -> bool {
        matches!(&self.p.peek_nth_token(n).token, Token::Word(x) if x.quote_style.is_none() && x.value.eq_ignore_ascii_case(w))
    }

    /// Whether `STREAM` (the next token) starts a stream source: `STREAM(t)`
    /// or `STREAM t`, not a table named `stream` followed by a clause.
    fn stream_follows(&self) -> bool {
        const CLAUSES: [&str; 9] = [
            "KEYS", "IGNORE", "APPLY", "SEQUENCE", "SYSTEM", "COLUMNS", "STORED", "TRACK", "WITH",
        ];
        match &self.p.peek_nth_token(1).token {
            Token::LParen => true,
            Token::Word(w) => !CLAUSES.iter().any(|c| w.value.eq_ignore_ascii_case(c)),
            _ => false,
        }
    }

    /// `[WITH (readChangeFeed = true | skipChangeCommits = true,
    /// startingVersion = n)]` after a stream source.
    fn stream_options(&mut self, flow: &str) -> Result<(StreamRead, Option<u64>)> {
        let mut read = StreamRead::AppendOnly;
        let mut starting = None;
        if !(self.peek_word(0, "WITH") && self.p.peek_nth_token(1).token == Token::LParen) {
            return Ok((read, starting));
        }
        self.p.next_token();
        self.p.next_token();
        let mut seen: Vec<String> = Vec::new();
        loop {
            let option = self.p.parse_identifier()?.value;
            // (a second value would silently win over the first)
            if seen.iter().any(|s| s.eq_ignore_ascii_case(&option)) {
                return Err(perr(format!(
                    "flow '{flow}': FROM STREAM option {option} is given twice"
                )));
            }
            seen.push(option.clone());
            let chosen = if option.eq_ignore_ascii_case("readChangeFeed") {
                StreamRead::ChangeFeed
            } else if option.eq_ignore_ascii_case("skipChangeCommits") {
                StreamRead::SkipChangeCommits
            } else if option.eq_ignore_ascii_case("startingVersion") {
                self.expect_token(Token::Eq)?;
                let version = match self.p.next_token().token {
                    Token::Number(n, _) => n.parse::<u64>().ok(),
                    Token::SingleQuotedString(n) => n.parse::<u64>().ok(),
                    _ => None,
                };
                let Some(version) = version else {
                    return Err(perr(format!(
                        "flow '{flow}': FROM STREAM option startingVersion takes a version (a whole number from 0)"
                    )));
                };
                starting = Some(version);
                if !self.p.consume_token(&Token::Comma) {
                    break;
                }
                continue;
            } else {
                return Err(perr(format!(
                    "flow '{flow}': unknown FROM STREAM option '{option}' (known: readChangeFeed, skipChangeCommits, startingVersion)"
                )));
            };
            self.expect_token(Token::Eq)?;
            let value = match self.p.next_token().token {
                Token::Word(w) if w.value.eq_ignore_ascii_case("true") => true,
                Token::Word(w) if w.value.eq_ignore_ascii_case("false") => false,
                Token::SingleQuotedString(s) if s.eq_ignore_ascii_case("true") => true,
                Token::SingleQuotedString(s) if s.eq_ignore_ascii_case("false") => false,
                t => {
                    return Err(perr(format!(
                        "flow '{flow}': FROM STREAM option {option} takes true or false, not {t}"
                    )))
                }
            };
            if value {
                if read != StreamRead::AppendOnly && read != chosen {
                    return Err(perr(format!(
                        "flow '{flow}': FROM STREAM takes readChangeFeed or skipChangeCommits, not both"
                    )));
                }
                read = chosen;
            }
            if !self.p.consume_token(&Token::Comma) {
                break;
            }
        }
        self.expect_token(Token::RParen)?;
        Ok((read, starting))
    }

    fn word(&mut self, w: &str) -> bool {
        if self.peek_word(0, w) {
            self.p.next_token();
            true
        } else {
            false
        }
    }

    fn expect_word(&mut self, w: &str) -> Result<()> {
        if self.word(w) {
            Ok(())
        } else {
            Err(perr(format!(
                "expected {w}, found {}",
                self.p.peek_token().token
            )))
        }
    }

    fn expect_token(&mut self, t: Token) -> Result<()> {
        if self.p.consume_token(&t) {
            Ok(())
        } else {
            Err(perr(format!(
                "expected {t}, found {}",
                self.p.peek_token().token
            )))
        }
    }

    fn ident(&self, i: &Ident) -> String {
        if i.quote_style.is_none() && self.normalize {
            i.value.to_lowercase()
        } else {
            i.value.clone()
        }
    }

    fn name_parts(&self, n: &ObjectName) -> Vec<String> {
        n.0.iter()
            .map(|part| {
                part.as_ident()
                    .map(|i| self.ident(i))
                    .unwrap_or_else(|| part.to_string())
            })
            .collect()
    }

    fn table_name(&mut self) -> Result<TableName> {
        let n = self.p.parse_object_name(false)?;
        TableName::from_parts(&self.name_parts(&n))
    }

    fn end(&mut self) -> Result<()> {
        while self.p.consume_token(&Token::SemiColon) {}
        match self.p.peek_token().token {
            Token::EOF => Ok(()),
            t => Err(perr(format!(
                "unexpected {t} after the end of the statement"
            ))),
        }
    }

    fn statement(&mut self, top: bool) -> Result<Option<CdcStatement>> {
        if top && self.peek_word(0, "EXPLAIN") {
            self.p.next_token();
            let analyze = self.word("ANALYZE");
            let verbose = self.word("VERBOSE");
            let format = if self.word("FORMAT") {
                match self.p.next_token().token {
                    Token::Word(w) => Some(w.value.to_lowercase()),
                    t => {
                        return Err(perr(format!(
                            "EXPLAIN FORMAT: expected a format, found {t}"
                        )))
                    }
                }
            } else {
                None
            };
            return Ok(self.statement(false)?.map(|s| CdcStatement::Explain {
                analyze,
                verbose,
                format,
                statement: Box::new(s),
            }));
        }
        let stmt = if self.peek_word(0, "CREATE") {
            let or_refresh = self.peek_word(1, "OR") && self.peek_word(2, "REFRESH");
            let at = if or_refresh { 3 } else { 1 };
            if self.peek_word(at, "STREAMING") && self.peek_word(at + 1, "TABLE") {
                for _ in 0..at + 2 {
                    self.p.next_token();
                }
                self.create_table(or_refresh)?
            } else if self.peek_word(at, "FLOW") {
                for _ in 0..at + 1 {
                    self.p.next_token();
                }
                let name = self.p.parse_identifier()?;
                let name = self.ident(&name);
                self.expect_word("AS")?;
                if self.peek_word(0, "INSERT") {
                    self.append_flow(name)?
                } else {
                    self.flow_body(Some(name))?
                }
            } else {
                return Ok(None);
            }
        } else if self.peek_word(0, "APPLY") && self.peek_word(1, "CHANGES") {
            self.flow_body(None)?
        } else if self.peek_word(0, "REFRESH") && self.peek_word(1, "PIPELINE") {
            self.p.next_token();
            self.p.next_token();
            let schema = if self.peek_word(0, "FULL") {
                None
            } else {
                match self.p.peek_token().token {
                    Token::Word(_) => {
                        let schema = self.p.parse_identifier()?;
                        Some(self.ident(&schema))
                    }
                    _ => None,
                }
            };
            let full = if self.word("FULL") {
                if self.p.consume_token(&Token::LParen) {
                    let mut tables = vec![self.table_name()?];
                    while self.p.consume_token(&Token::Comma) {
                        tables.push(self.table_name()?);
                    }
                    self.expect_token(Token::RParen)?;
                    FullRefresh::Tables(tables)
                } else {
                    FullRefresh::All
                }
            } else {
                FullRefresh::None
            };
            CdcStatement::RefreshPipeline { schema, full }
        } else if self.peek_word(0, "REFRESH") && self.peek_word(1, "STREAMING") {
            self.p.next_token();
            self.p.next_token();
            self.expect_word("TABLE")?;
            let name = self.table_name()?;
            let full = self.word("FULL");
            CdcStatement::Refresh { name, full }
        } else if top
            && self.peek_word(0, "RESTORE")
            && (self.peek_word(1, "STREAMING") || self.peek_word(1, "TABLE"))
        {
            self.p.next_token();
            self.word("STREAMING");
            self.expect_word("TABLE")?;
            let name = self.table_name()?;
            self.word("TO");
            let to = if self.word("VERSION") {
                self.expect_word("AS")?;
                self.expect_word("OF")?;
                match self.p.next_token().token {
                    Token::Number(n, _) => match n.parse::<u64>() {
                        Ok(v) => RestoreTo::Version(v),
                        Err(_) => {
                            return Err(perr(format!(
                                "RESTORE: VERSION AS OF takes a commit version (a \
                                 non-negative integer), found {n}"
                            )))
                        }
                    },
                    t => {
                        return Err(perr(format!(
                            "RESTORE: VERSION AS OF takes a commit version, found {t}"
                        )))
                    }
                }
            } else if self.word("TIMESTAMP") {
                self.expect_word("AS")?;
                self.expect_word("OF")?;
                // 'ts' or TIMESTAMP 'ts'
                self.word("TIMESTAMP");
                match self.p.next_token().token {
                    Token::SingleQuotedString(ts) => RestoreTo::Timestamp(ts),
                    t => {
                        return Err(perr(format!(
                            "RESTORE: TIMESTAMP AS OF takes a timestamp string, found {t}"
                        )))
                    }
                }
            } else {
                return Err(perr(
                    "RESTORE: expected TO VERSION AS OF n or TO TIMESTAMP AS OF 'timestamp'"
                        .to_string(),
                ));
            };
            CdcStatement::Restore { name, to }
        } else if self.peek_word(0, "DROP") && self.peek_word(1, "STREAMING") {
            self.p.next_token();
            self.p.next_token();
            self.expect_word("TABLE")?;
            let if_exists = self.p.parse_keywords(&[Keyword::IF, Keyword::EXISTS]);
            let name = self.table_name()?;
            CdcStatement::Drop { name, if_exists }
        } else if self.peek_word(0, "DROP") && self.peek_word(1, "FLOW") {
            self.p.next_token();
            self.p.next_token();
            let if_exists = self.p.parse_keywords(&[Keyword::IF, Keyword::EXISTS]);
            let name = self.p.parse_identifier()?;
            CdcStatement::DropFlow {
                name: self.ident(&name),
                if_exists,
            }
        } else if self.peek_word(0, "MERGE")
            || (self.peek_word(0, "WITH") && self.merge_after_with())
        {
            self.merge()?
        } else if top && self.peek_word(0, "SHOW") && self.peek_word(1, "TBLPROPERTIES") {
            self.p.next_token();
            self.p.next_token();
            let name = self.table_name()?;
            let key = if self.p.consume_token(&Token::LParen) {
                // a string literal or a dotted name: ('delta.x') or (delta.x)
                let key = match self.p.peek_token().token {
                    Token::SingleQuotedString(_) | Token::DoubleQuotedString(_) => {
                        self.p.parse_literal_string()?
                    }
                    _ => self
                        .p
                        .parse_object_name(false)?
                        .0
                        .iter()
                        .map(|part| part.to_string())
                        .collect::<Vec<_>>()
                        .join("."),
                };
                self.expect_token(Token::RParen)?;
                Some(key)
            } else {
                None
            };
            CdcStatement::ShowProperties { name, key }
        } else {
            return Ok(None);
        };
        self.end()?;
        Ok(Some(stmt))
    }

    fn create_table(&mut self, or_refresh: bool) -> Result<CdcStatement> {
        let if_not_exists = self
            .p
            .parse_keywords(&[Keyword::IF, Keyword::NOT, Keyword::EXISTS]);
        let name = self.table_name()?;
        let mut columns = Vec::new();
        let mut expectations: Vec<Expectation> = Vec::new();
        if self.p.consume_token(&Token::LParen) {
            loop {
                if self.word("CONSTRAINT") {
                    let expectation = self.expectation(&name)?;
                    if expectations.iter().any(|e| e.name == expectation.name) {
                        return Err(perr(format!(
                            "streaming table '{name}': CONSTRAINT {} is defined twice",
                            expectation.name
                        )));
                    }
                    expectations.push(expectation);
                } else {
                    let def = self.p.parse_column_def()?;
                    let column = self.ident(&def.name);
                    // (an option the table would not keep is refused, not
                    // dropped)
                    if let Some(option) = def.options.first() {
                        let not_null = matches!(
                            option.option,
                            datafusion::sql::sqlparser::ast::ColumnOption::NotNull
                        );
                        return Err(perr(format!(
                            "streaming table '{name}': column '{column}': {} is not supported{}",
                            option.option,
                            match not_null {
                                true => format!(
                                    "; CONSTRAINT {column}_not_null EXPECT ({column} IS NOT NULL) \
                                     ON VIOLATION FAIL UPDATE checks it"
                                ),
                                false => String::new(),
                            }
                        )));
                    }
                    columns.push((column, def.data_type.to_string()));
                }
                if !self.p.consume_token(&Token::Comma) {
                    break;
                }
            }
            self.expect_token(Token::RParen)?;
        }
        let mut properties = Vec::new();
        let mut comment = None;
        loop {
            if self.word("COMMENT") {
                comment = Some(self.p.parse_literal_string()?);
            } else if self.word("TBLPROPERTIES") {
                self.expect_token(Token::LParen)?;
                loop {
                    let key = match self.p.peek_token().token {
                        Token::SingleQuotedString(_) | Token::DoubleQuotedString(_) => {
                            self.p.parse_literal_string()?
                        }
                        _ => {
                            let n = self.p.parse_object_name(false)?;
                            n.0.iter()
                                .map(|p| p.to_string())
                                .collect::<Vec<_>>()
                                .join(".")
                        }
                    };
                    self.expect_token(Token::Eq)?;
                    let value = match self.p.next_token().token {
                        Token::SingleQuotedString(s) | Token::DoubleQuotedString(s) => s,
                        Token::Number(n, _) => n,
                        Token::Word(w) => w.value,
                        t => return Err(perr(format!("TBLPROPERTIES: unexpected value {t}"))),
                    };
                    properties.push((key, value));
                    if !self.p.consume_token(&Token::Comma) {
                        break;
                    }
                }
                self.expect_token(Token::RParen)?;
            } else {
                break;
            }
        }
        let (query, flow) = if self.word("AS") {
            (Some(self.p.parse_query()?.to_string()), None)
        } else if self.word("FLOW") {
            // the inline flow: `FLOW AUTO CDC [ONCE] FROM …`
            self.expect_word("AUTO")?;
            self.expect_word("CDC")?;
            let once = self.word("ONCE");
            let spec = self.flow_from(name.table.clone(), &name, once)?;
            (None, Some(Box::new(spec)))
        } else {
            (None, None)
        };
        Ok(CdcStatement::CreateStreamingTable(CreateStreamingTable {
            name,
            or_refresh,
            if_not_exists,
            columns,
            properties,
            dialect: self.dialect.clone(),
            query,
            flow,
            expectations,
            comment,
        }))
    }

    /// `name EXPECT (condition) [ON VIOLATION {DROP ROW | FAIL UPDATE}]`,
    /// after `CONSTRAINT`.
    fn expectation(&mut self, table: &TableName) -> Result<Expectation> {
        let name = self.p.parse_identifier()?;
        let name = self.ident(&name);
        if !self.word("EXPECT") {
            return Err(perr(format!(
                "streaming table '{table}': CONSTRAINT {name}: expected EXPECT (condition), found {}",
                self.p.peek_token().token
            )));
        }
        self.expect_token(Token::LParen)?;
        let condition = self.p.parse_expr()?.to_string();
        self.expect_token(Token::RParen)?;
        let on_violation = if self.word("ON") {
            self.expect_word("VIOLATION")?;
            if self.word("DROP") {
                self.expect_word("ROW")?;
                OnViolation::DropRow
            } else if self.word("FAIL") {
                self.expect_word("UPDATE")?;
                OnViolation::FailUpdate
            } else {
                return Err(perr(format!(
                    "streaming table '{table}': CONSTRAINT {name}: ON VIOLATION takes DROP ROW or FAIL UPDATE, found {}",
                    self.p.peek_token().token
                )));
            }
        } else {
            OnViolation::Keep
        };
        Ok(Expectation {
            name,
            condition,
            on_violation,
            dialect: self.dialect.clone(),
        })
    }

    fn column_list(&mut self) -> Result<Vec<String>> {
        self.expect_token(Token::LParen)?;
        let ids = self.p.parse_comma_separated(|p| p.parse_identifier())?;
        self.expect_token(Token::RParen)?;
        Ok(ids.iter().map(|i| self.ident(i)).collect())
    }

    /// `(c, ...)` or `* EXCEPT (c, ...)`.
    fn selection(&mut self) -> Result<ColumnSelection> {
        if self.p.consume_token(&Token::Mul) {
            if self.p.parse_keyword(Keyword::EXCEPT) {
                return Ok(ColumnSelection::Except(self.column_list()?));
            }
            return Ok(ColumnSelection::All);
        }
        Ok(ColumnSelection::Only(self.column_list()?))
    }

    fn sequence(&self, e: SqlExpr) -> SequenceBy {
        let as_ident = |e: &SqlExpr| match e {
            SqlExpr::Identifier(i) => Some(self.ident(i)),
            _ => None,
        };
        match &e {
            SqlExpr::Identifier(i) => return SequenceBy::Column(self.ident(i)),
            SqlExpr::Function(f) if f.name.to_string().eq_ignore_ascii_case("struct") => {
                if let FunctionArguments::List(list) = &f.args {
                    let cols: Option<Vec<String>> = list
                        .args
                        .iter()
                        .map(|a| match a {
                            FunctionArg::Unnamed(FunctionArgExpr::Expr(e)) => as_ident(e),
                            _ => None,
                        })
                        .collect();
                    if let Some(cols) = cols.filter(|c| !c.is_empty()) {
                        return SequenceBy::Struct(cols);
                    }
                }
            }
            SqlExpr::Struct { values, fields } if fields.is_empty() => {
                let cols: Option<Vec<String>> = values.iter().map(as_ident).collect();
                if let Some(cols) = cols.filter(|c| !c.is_empty()) {
                    return SequenceBy::Struct(cols);
                }
            }
            _ => {}
        }
        SequenceBy::Expr(e.to_string())
    }

    /// Whether the statement starting with `WITH` (the next token) is a
    /// `MERGE`: the word after the CTEs — after a closing parenthesis back
    /// at the top that neither a comma (another CTE) nor `AS` (a CTE's
    /// column list) follows. (A CTE may be named `merge`.)
    fn merge_after_with(&self) -> bool {
        let mut depth = 0usize;
        for n in 1.. {
            match &self.p.peek_nth_token(n).token {
                Token::LParen => depth += 1,
                Token::RParen => {
                    depth = depth.saturating_sub(1);
                    if depth == 0 {
                        match &self.p.peek_nth_token(n + 1).token {
                            Token::Comma => {}
                            Token::Word(w) if w.value.eq_ignore_ascii_case("AS") => {}
                            Token::Word(w) => {
                                return w.quote_style.is_none()
                                    && w.value.eq_ignore_ascii_case("MERGE")
                            }
                            _ => return false,
                        }
                    }
                }
                Token::EOF | Token::SemiColon => return false,
                _ => {}
            }
        }
        false
    }

    /// `[WITH …] MERGE INTO ...`, parsed by sqlparser and kept as SQL texts
    /// (a `WITH` clause goes with the source, the only relation it can
    /// name: `USING c` is `USING (WITH … SELECT * FROM c) AS c`).
    fn merge(&mut self) -> Result<CdcStatement> {
        use datafusion::sql::sqlparser::ast::{
            AssignmentTarget, MergeAction as SqlAction, MergeClauseKind, MergeInsertKind, SetExpr,
            Statement, TableFactor,
        };
        let expected = || perr("expected [WITH …] MERGE INTO target USING source ON ...");
        let (with, merge) = match self.p.parse_statement()? {
            Statement::Merge(merge) => (None, merge),
            Statement::Query(query) => match (query.with, *query.body) {
                (Some(with), SetExpr::Merge(Statement::Merge(merge))) => (Some(with), merge),
                _ => return Err(expected()),
            },
            _ => return Err(expected()),
        };
        // (a CTE reaches only the source: a subquery of the ON condition
        // would read a table of the CTE's name instead, or none)
        if with.is_some() && has_subquery(&merge.on) {
            return Err(perr(
                "WITH … MERGE: the CTEs are the USING source's; the ON condition cannot read \
                 them in a subquery: join what it reads into the USING source",
            ));
        }
        let source_text = relation_text(&merge.source);
        let source = match &with {
            None => source_text,
            Some(with) => {
                let alias = match &merge.source {
                    TableFactor::Table {
                        alias: Some(alias), ..
                    }
                    | TableFactor::Derived {
                        alias: Some(alias), ..
                    } => alias.name.to_string(),
                    TableFactor::Table { name, .. } => name
                        .0
                        .last()
                        .map_or_else(|| "source".to_string(), |part| part.to_string()),
                    _ => "source".to_string(),
                };
                format!("({with} SELECT * FROM {source_text}) AS {alias}")
            }
        };
        let TableFactor::Table { name, alias, .. } = &merge.table else {
            return Err(perr(
                "MERGE INTO: the target must be a streaming table's name",
            ));
        };
        let target = TableName::from_parts(&self.name_parts(name))?;
        let target_alias = alias
            .as_ref()
            .map(|a| self.ident(&a.name))
            .unwrap_or_else(|| target.table.clone());
        let column = |n: &datafusion::sql::sqlparser::ast::ObjectName| -> Result<String> {
            match self.name_parts(n).last() {
                Some(c) => Ok(c.clone()),
                None => Err(perr(format!("MERGE INTO {target}: empty column name"))),
            }
        };
        let mut clauses = Vec::new();
        for clause in &merge.clauses {
            let matched = match clause.clause_kind {
                MergeClauseKind::Matched => true,
                MergeClauseKind::NotMatched | MergeClauseKind::NotMatchedByTarget => false,
                MergeClauseKind::NotMatchedBySource => {
                    return Err(perr(format!(
                        "MERGE INTO {target}: WHEN NOT MATCHED BY SOURCE is not supported"
                    )))
                }
            };
            let action = match &clause.action {
                SqlAction::Update(update) => {
                    if update.update_predicate.is_some() || update.delete_predicate.is_some() {
                        return Err(perr(format!(
                            "MERGE INTO {target}: UPDATE ... WHERE / DELETE WHERE is not supported; use WHEN MATCHED AND condition"
                        )));
                    }
                    let mut set = Vec::new();
                    for assignment in &update.assignments {
                        let AssignmentTarget::ColumnName(name) = &assignment.target else {
                            return Err(perr(format!(
                                "MERGE INTO {target}: assign one column at a time"
                            )));
                        };
                        set.push((column(name)?, assignment.value.to_string()));
                    }
                    MergeAction::Update(set)
                }
                SqlAction::Delete { .. } => MergeAction::Delete,
                SqlAction::Insert(insert) => {
                    let MergeInsertKind::Values(values) = &insert.kind else {
                        return Err(perr(format!(
                            "MERGE INTO {target}: INSERT takes VALUES (...)"
                        )));
                    };
                    let [row] = values.rows.as_slice() else {
                        return Err(perr(format!(
                            "MERGE INTO {target}: INSERT takes one VALUES row"
                        )));
                    };
                    MergeAction::Insert {
                        columns: insert.columns.iter().map(column).collect::<Result<_>>()?,
                        values: row.iter().map(|e| e.to_string()).collect(),
                    }
                }
            };
            if matched == matches!(action, MergeAction::Insert { .. }) {
                return Err(perr(format!(
                    "MERGE INTO {target}: WHEN {}MATCHED cannot {}",
                    if matched { "" } else { "NOT " },
                    if matched {
                        "INSERT"
                    } else {
                        "UPDATE or DELETE"
                    }
                )));
            }
            clauses.push(MergeClause {
                matched,
                condition: clause.predicate.as_ref().map(|p| p.to_string()),
                action,
            });
        }
        Ok(CdcStatement::Merge(Box::new(MergeStatement {
            target,
            target_alias,
            source,
            on: merge.on.to_string(),
            clauses,
            dialect: self.dialect.clone(),
        })))
    }

    /// `INSERT INTO [ONCE] target BY NAME query` of `CREATE FLOW name AS
    /// ...`: an append flow (`ONCE`: run when defined and on a full refresh
    /// only).
    fn append_flow(&mut self, name: String) -> Result<CdcStatement> {
        self.expect_word("INSERT")?;
        self.expect_word("INTO")?;
        let once = self.word("ONCE");
        let target = self.table_name()?;
        if !(self.word("BY") && self.word("NAME")) {
            return Err(perr(format!(
                "flow '{name}': an append flow is written INSERT INTO [ONCE] {target} BY NAME <query>"
            )));
        }
        let query = self.p.parse_query()?.to_string();
        let mut spec = FlowSpec::append(name, target.to_string(), query, self.dialect.clone());
        spec.once = once;
        Ok(CdcStatement::CreateFlow(Box::new(spec)))
    }

    fn flow_body(&mut self, name: Option<String>) -> Result<CdcStatement> {
        if self.word("AUTO") {
            self.expect_word("CDC")?;
        } else {
            self.expect_word("APPLY")?;
            self.expect_word("CHANGES")?;
        }
        let once = self.word("ONCE");
        self.expect_word("INTO")?;
        let target = self.table_name()?;
        let flow_name = name.unwrap_or_else(|| target.table.clone());
        let spec = self.flow_from(flow_name, &target, once)?;
        Ok(CdcStatement::CreateFlow(Box::new(spec)))
    }

    /// The part of an AUTO CDC flow from `FROM` on (of `CREATE FLOW … AS
    /// AUTO CDC [ONCE] INTO target`, or of `CREATE STREAMING TABLE target
    /// … FLOW AUTO CDC [ONCE]`).
    fn flow_from(&mut self, flow_name: String, target: &TableName, once: bool) -> Result<FlowSpec> {
        self.expect_word("FROM")?;
        let mut stream = StreamRead::Rows;
        let mut starting_version = None;
        let source = if self.word("SNAPSHOT") {
            self.expect_token(Token::LParen)?;
            let query = self.p.parse_query()?.to_string();
            self.expect_token(Token::RParen)?;
            let version_query = if self.p.parse_keyword(Keyword::WITH) {
                self.expect_word("VERSION")?;
                self.expect_token(Token::LParen)?;
                let q = self.p.parse_query()?.to_string();
                self.expect_token(Token::RParen)?;
                Some(q)
            } else {
                None
            };
            FlowSource::Snapshot {
                query,
                version_query,
            }
        } else if self.peek_word(0, "STREAM") && self.stream_follows() {
            self.p.next_token();
            let n = if self.p.consume_token(&Token::LParen) {
                let n = self.p.parse_object_name(false)?;
                self.expect_token(Token::RParen)?;
                n
            } else {
                self.p.parse_object_name(false)?
            };
            (stream, starting_version) = self.stream_options(&flow_name)?;
            FlowSource::Table(n.to_string())
        } else if self.p.consume_token(&Token::LParen) {
            let q = self.p.parse_query()?;
            self.expect_token(Token::RParen)?;
            FlowSource::Query(q.to_string())
        } else if self.peek_word(0, "DEBEZIUM") && self.p.peek_nth_token(1).token == Token::LParen {
            self.p.next_token();
            self.expect_token(Token::LParen)?;
            let path = self.p.parse_literal_string()?;
            self.expect_token(Token::RParen)?;
            FlowSource::Debezium { path }
        } else {
            FlowSource::Table(self.p.parse_object_name(false)?.to_string())
        };
        let mut spec = FlowSpec::new(flow_name, target.to_string(), source);
        spec.stream = stream;
        spec.starting_version = starting_version;
        spec.once = once;
        spec.dialect = self.dialect.clone();
        self.flow_clauses(&mut spec)?;
        Ok(spec.with_source_defaults())
    }

    /// The clauses of a flow after its source (`KEYS …`, `SEQUENCE BY …`,
    /// …), in any order, each at most once.
    fn flow_clauses(&mut self, spec: &mut FlowSpec) -> Result<()> {
        let mut seen: Vec<&'static str> = Vec::new();
        let mut once_clause = |clause: &'static str, flow: &str| -> Result<()> {
            if seen.contains(&clause) {
                return Err(perr(format!("flow '{flow}': clause {clause} given twice")));
            }
            seen.push(clause);
            Ok(())
        };
        loop {
            if self.word("KEYS") {
                once_clause("KEYS", &spec.name)?;
                spec.keys = self.column_list()?;
            } else if self.peek_word(0, "PREVIOUS") && self.peek_word(1, "KEYS") {
                self.p.next_token();
                self.p.next_token();
                once_clause("PREVIOUS KEYS", &spec.name)?;
                self.expect_token(Token::LParen)?;
                let exprs = self.p.parse_comma_separated(|p| p.parse_expr())?;
                self.expect_token(Token::RParen)?;
                spec.previous_keys = exprs.iter().map(|e| e.to_string()).collect();
            } else if self.peek_word(0, "IGNORE") {
                self.p.next_token();
                self.expect_word("NULL")?;
                self.expect_word("UPDATES")?;
                once_clause("IGNORE NULL UPDATES", &spec.name)?;
                spec.ignore_null_updates = Some(if self.word("ON") {
                    self.selection()?
                } else {
                    ColumnSelection::All
                });
            } else if self.peek_word(0, "APPLY") && self.peek_word(1, "AS") {
                self.p.next_token();
                self.p.next_token();
                if self.word("DELETE") {
                    self.expect_word("WHEN")?;
                    once_clause("APPLY AS DELETE WHEN", &spec.name)?;
                    spec.apply_as_deletes = Some(self.p.parse_expr()?.to_string());
                } else {
                    self.expect_word("TRUNCATE")?;
                    self.expect_word("WHEN")?;
                    once_clause("APPLY AS TRUNCATE WHEN", &spec.name)?;
                    spec.apply_as_truncates = Some(self.p.parse_expr()?.to_string());
                }
            } else if self.peek_word(0, "SEQUENCE") {
                self.p.next_token();
                self.expect_word("BY")?;
                once_clause("SEQUENCE BY", &spec.name)?;
                let e = self.p.parse_expr()?;
                spec.sequence_by = Some(self.sequence(e));
            } else if self.peek_word(0, "SYSTEM") && self.peek_word(1, "SEQUENCE") {
                self.p.next_token();
                self.p.next_token();
                self.expect_word("BY")?;
                once_clause("SYSTEM SEQUENCE BY", &spec.name)?;
                spec.system_sequence_by = Some(self.p.parse_expr()?.to_string());
            } else if self.peek_word(0, "COLUMNS") && self.peek_word(1, "TO") {
                self.p.next_token();
                self.p.next_token();
                self.expect_word("UPDATE")?;
                once_clause("COLUMNS TO UPDATE", &spec.name)?;
                let i = self.p.parse_identifier()?;
                spec.columns_to_update = Some(self.ident(&i));
            } else if self.word("COLUMNS") {
                once_clause("COLUMNS", &spec.name)?;
                spec.columns = self.selection()?;
            } else if self.peek_word(0, "STORED") {
                self.p.next_token();
                self.expect_word("AS")?;
                once_clause("STORED AS", &spec.name)?;
                spec.stored_as_scd_type = if self.word("BITEMPORAL") {
                    ScdType::Bitemporal
                } else {
                    self.expect_word("SCD")?;
                    self.expect_word("TYPE")?;
                    match self.p.next_token().token {
                        Token::Number(n, _) if n == "1" => ScdType::Type1,
                        Token::Number(n, _) if n == "2" => ScdType::Type2,
                        t => {
                            return Err(perr(format!(
                                "flow '{}': STORED AS SCD TYPE must be 1 or 2, found {t}",
                                spec.name
                            )))
                        }
                    }
                };
            } else if self.peek_word(0, "TRACK") {
                self.p.next_token();
                self.expect_word("HISTORY")?;
                self.expect_word("ON")?;
                once_clause("TRACK HISTORY ON", &spec.name)?;
                spec.track_history = Some(self.selection()?);
            } else {
                break;
            }
        }
        Ok(())
    }

    /// `SNAPSHOTS (query) VERSION BY v KEYS (…) [COLUMNS …] [STORED AS …]
    /// [TRACK HISTORY ON …]`, after `FROM`: a relation folding the snapshots
    /// `query` holds, one per value of `v`.
    fn snapshots_relation(&mut self) -> Result<AutoCdcRelation> {
        const WHAT: &str = "FROM SNAPSHOTS (query) VERSION BY v KEYS (…)";
        self.expect_word("SNAPSHOTS")?;
        self.expect_token(Token::LParen)?;
        let query = self.p.parse_query()?.to_string();
        self.expect_token(Token::RParen)?;
        if !(self.word("VERSION") && self.word("BY")) {
            return Err(perr(format!("{WHAT}: expected VERSION BY after the query")));
        }
        let version = self.p.parse_identifier()?;
        let version = self.ident(&version);
        let target = TableName::from_parts(&["snapshots".to_string()])?;
        let mut spec = FlowSpec::new(
            "snapshots".to_string(),
            target.to_string(),
            FlowSource::Query(query.clone()),
        );
        spec.dialect = self.dialect.clone();
        self.flow_clauses(&mut spec)?;
        let refused = [
            ("SEQUENCE BY", spec.sequence_by.is_some()),
            ("SYSTEM SEQUENCE BY", spec.system_sequence_by.is_some()),
            ("APPLY AS DELETE WHEN", spec.apply_as_deletes.is_some()),
            ("APPLY AS TRUNCATE WHEN", spec.apply_as_truncates.is_some()),
            ("IGNORE NULL UPDATES", spec.ignore_null_updates.is_some()),
            ("COLUMNS TO UPDATE", spec.columns_to_update.is_some()),
            ("PREVIOUS KEYS", !spec.previous_keys.is_empty()),
        ];
        if let Some((clause, _)) = refused.iter().find(|(_, given)| *given) {
            return Err(perr(format!(
                "{WHAT}: {clause} is not a clause of snapshots: they are sequenced by their \
                 version, and a key missing from a snapshot is deleted"
            )));
        }
        if spec.stored_as_scd_type == ScdType::Bitemporal {
            return Err(perr(format!(
                "{WHAT}: STORED AS BITEMPORAL: snapshots are stored AS SCD TYPE 1 or SCD TYPE 2 \
                 (a snapshot has no system time of its own)"
            )));
        }
        Ok(AutoCdcRelation {
            spec,
            query,
            snapshot_version: Some(version),
            changes: false,
        })
    }

    /// `WITH CHANGES` after a relation's clauses (consumed when present).
    fn with_changes(&mut self) -> bool {
        let found = self.peek_word(0, "WITH") && self.peek_word(1, "CHANGES");
        if found {
            self.p.next_token();
            self.p.next_token();
        }
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(sql: &str, dialect: &str) -> CdcStatement {
        parse_cdc_statement(sql, dialect, true).unwrap().unwrap()
    }

    #[test]
    fn documented_flow_under_databricks() {
        let s = parse(
            r#"CREATE FLOW flow AS AUTO CDC INTO target FROM stream(cdc_data.users)
               KEYS (userId) APPLY AS DELETE WHEN operation = "DELETE" SEQUENCE BY sequenceNum
               COLUMNS * EXCEPT (operation, sequenceNum) STORED AS SCD TYPE 1"#,
            "databricks",
        );
        let CdcStatement::CreateFlow(f) = s else {
            panic!("not a flow")
        };
        assert_eq!(f.name, "flow");
        assert_eq!(f.target, "target");
        assert_eq!(f.source, FlowSource::Table("cdc_data.users".into()));
        assert_eq!(f.keys, vec!["userid"]);
        assert_eq!(
            f.sequence_by,
            Some(SequenceBy::Column("sequencenum".into()))
        );
        assert_eq!(
            f.columns,
            ColumnSelection::Except(vec!["operation".into(), "sequencenum".into()])
        );
        assert_eq!(
            f.apply_as_deletes.as_deref(),
            Some(r#"operation = "DELETE""#)
        );
    }

    #[test]
    fn other_statements_pass_through() {
        assert!(parse_cdc_statement("SELECT 1", "generic", true)
            .unwrap()
            .is_none());
        assert!(
            parse_cdc_statement("CREATE TABLE t (a INT)", "generic", true)
                .unwrap()
                .is_none()
        );
        assert!(parse_cdc_statement("EXPLAIN SELECT 1", "generic", true)
            .unwrap()
            .is_none());
    }

    #[test]
    fn struct_sequence_and_refresh() {
        let CdcStatement::CreateFlow(f) = parse(
            "APPLY CHANGES INTO s.t FROM (SELECT * FROM src) KEYS (id) SEQUENCE BY STRUCT(ts, n)",
            "generic",
        ) else {
            panic!()
        };
        assert_eq!(f.name, "t");
        assert_eq!(f.target, "s.t");
        assert_eq!(
            f.sequence_by,
            Some(SequenceBy::Struct(vec!["ts".into(), "n".into()]))
        );
        assert_eq!(
            parse("REFRESH STREAMING TABLE s.t FULL;", "generic"),
            CdcStatement::Refresh {
                name: TableName::parse("s.t").unwrap(),
                full: true
            }
        );
    }

    #[test]
    fn restore_statements() {
        let restore = |name: &str, to| CdcStatement::Restore {
            name: TableName::parse(name).unwrap(),
            to,
        };
        assert_eq!(
            parse("RESTORE STREAMING TABLE s.t TO VERSION AS OF 3", "generic"),
            restore("s.t", RestoreTo::Version(3))
        );
        assert_eq!(
            parse("restore table t version as of 0;", "generic"),
            restore("t", RestoreTo::Version(0))
        );
        assert_eq!(
            parse(
                "RESTORE TABLE t TO TIMESTAMP AS OF TIMESTAMP '2026-12-01 10:00:00'",
                "generic"
            ),
            restore("t", RestoreTo::Timestamp("2026-12-01 10:00:00".into()))
        );
        assert_eq!(
            parse("RESTORE TABLE t TIMESTAMP AS OF '2026-12-01'", "generic"),
            restore("t", RestoreTo::Timestamp("2026-12-01".into()))
        );
        for bad in [
            "RESTORE TABLE t TO VERSION AS OF -1",
            "RESTORE TABLE t TO VERSION AS OF 'x'",
            "RESTORE TABLE t TO 3",
            "RESTORE TABLE t TO TIMESTAMP AS OF 5",
        ] {
            assert!(
                parse_cdc_statement(bad, "generic", true).is_err(),
                "{bad} should be refused"
            );
        }
    }
}
