//! The pipeline of a warehouse: which streaming tables each table's flows
//! read, and the order that updates every table after what it reads
//! (SPEC §4.7).
//!
//! | a flow's source                                   | tables it reads        |
//! |---------------------------------------------------|------------------------|
//! | `FROM t`, `FROM STREAM t`, `stream(t)`            | `t`                    |
//! | `FROM (query)`, snapshot and version queries      | every relation named, `STREAM t` / `stream(t)`, `table_changes('t', …)`, `table_as_of('t', …)`, `scd2_as_of('t', …)`, `bitemporal_as_of('t', …)`, `event_log('t')` |
//! | a Rust snapshot function                          | none (it is opaque)    |
//!
//! A view of the session is read through: a flow reading it reads the
//! relations its query reads ([`through_views`]). Names that are not
//! streaming tables of the warehouse (plain tables, CTE names, files) are
//! sources, not part of the pipeline.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::ops::ControlFlow;

use datafusion::common::{DataFusionError, Result};
use datafusion::sql::parser::{DFParserBuilder, Statement as DFStatement};
use datafusion::sql::sqlparser::ast::{
    Expr as SqlExpr, FunctionArg, FunctionArgExpr, ObjectName, TableFactor, Value, Visit, Visitor,
};
use datafusion::sql::sqlparser::dialect::dialect_from_str;

use super::streams::stream_of;
use crate::spec::{FlowSource, FlowSpec};
use crate::table::TableName;

/// Table functions whose first argument names the streaming table they read.
const TABLE_FUNCTIONS: [&str; 5] = [
    "table_changes",
    "table_as_of",
    "scd2_as_of",
    "bitemporal_as_of",
    "event_log",
];

/// The names of the relations `flow` reads (see the module docs), as
/// normalised table names; names that cannot be table names are left out.
pub fn flow_reads(flow: &FlowSpec) -> Result<BTreeSet<TableName>> {
    let mut names = BTreeSet::new();
    let queries: Vec<&str> = match &flow.source {
        FlowSource::Table(name) => {
            names.extend(table_name(name));
            vec![]
        }
        FlowSource::Query(query) => vec![query],
        FlowSource::Snapshot {
            query,
            version_query,
        } => std::iter::once(query.as_str())
            .chain(version_query.as_deref())
            .collect(),
        FlowSource::SnapshotFunction | FlowSource::Debezium { .. } => vec![],
    };
    for query in queries {
        names.extend(relations(query, &flow.dialect)?);
    }
    Ok(names)
}

/// A dotted name as written, normalised (unquoted parts lower case).
fn table_name(written: &str) -> Option<TableName> {
    let parts: Vec<String> = written
        .split('.')
        .map(
            |part| match part.strip_prefix('"').and_then(|p| p.strip_suffix('"')) {
                Some(quoted) => quoted.to_string(),
                None => part.to_lowercase(),
            },
        )
        .collect();
    TableName::from_parts(&parts).ok()
}

fn object_name(name: &ObjectName) -> Option<TableName> {
    let parts: Vec<String> = name
        .0
        .iter()
        .map(|part| {
            let ident = part.as_ident()?;
            Some(match ident.quote_style {
                Some(_) => ident.value.clone(),
                None => ident.value.to_lowercase(),
            })
        })
        .collect::<Option<_>>()?;
    TableName::from_parts(&parts).ok()
}

/// The relations `query` (in `dialect`) reads.
fn relations(query: &str, dialect: &str) -> Result<BTreeSet<TableName>> {
    let d = dialect_from_str(dialect)
        .ok_or_else(|| DataFusionError::Plan(format!("unsupported SQL dialect '{dialect}'")))?;
    let statement = DFParserBuilder::new(query)
        .with_dialect(d.as_ref())
        .build()?
        .parse_statements()?
        .pop_front();
    let mut visitor = Relations::default();
    if let Some(DFStatement::Statement(ast)) = statement {
        let _ = ast.visit(&mut visitor);
    }
    Ok(visitor.found)
}

/// Collects the tables of every table factor.
#[derive(Default)]
struct Relations {
    found: BTreeSet<TableName>,
}

impl Visitor for Relations {
    type Break = ();

    fn pre_visit_table_factor(&mut self, factor: &TableFactor) -> ControlFlow<()> {
        if let Some(Ok(stream)) = stream_of(factor) {
            self.found.extend(table_name(&stream.table));
            return ControlFlow::Continue(());
        }
        let TableFactor::Table { name, args, .. } = factor else {
            return ControlFlow::Continue(());
        };
        match args {
            None => self.found.extend(object_name(name)),
            Some(args) => {
                let function = name.to_string().to_lowercase();
                if TABLE_FUNCTIONS.contains(&function.as_str()) {
                    if let Some(FunctionArg::Unnamed(FunctionArgExpr::Expr(SqlExpr::Value(v)))) =
                        args.args.first()
                    {
                        if let Value::SingleQuotedString(table) = &v.value {
                            self.found.extend(table_name(table));
                        }
                    }
                }
            }
        }
        ControlFlow::Continue(())
    }
}

/// Views a flow may read, each with the relations its query reads (views
/// among them): a flow reading a view reads what the view reads.
pub type Views = BTreeMap<TableName, BTreeSet<TableName>>;

/// `reads` with each view replaced by what it reads, through nested views.
pub fn through_views(reads: BTreeSet<TableName>, views: &Views) -> BTreeSet<TableName> {
    let mut found = BTreeSet::new();
    let mut seen = BTreeSet::new();
    let mut queue: VecDeque<TableName> = reads.into_iter().collect();
    while let Some(name) = queue.pop_front() {
        match views.get(&name) {
            Some(read) if seen.insert(name.clone()) => queue.extend(read.iter().cloned()),
            Some(_) => {}
            None => {
                found.insert(name);
            }
        }
    }
    found
}

/// The streaming tables of a pipeline and, for each, those its flows read.
#[derive(Debug, Default, Clone)]
pub struct PipelineGraph {
    /// Table → the pipeline's tables it reads.
    pub upstream: BTreeMap<TableName, BTreeSet<TableName>>,
}

impl PipelineGraph {
    /// The graph of `tables` (each with its flows); reads of anything else
    /// are sources.
    #[cfg(test)]
    pub fn new<'a>(
        tables: impl IntoIterator<Item = (TableName, impl IntoIterator<Item = &'a FlowSpec>)>,
    ) -> Result<Self> {
        Self::with_views(tables, &Views::new())
    }

    /// The graph of `tables`, where a flow reading one of `views` reads
    /// what the view reads.
    pub fn with_views<'a>(
        tables: impl IntoIterator<Item = (TableName, impl IntoIterator<Item = &'a FlowSpec>)>,
        views: &Views,
    ) -> Result<Self> {
        let mut reads: BTreeMap<TableName, BTreeSet<TableName>> = BTreeMap::new();
        for (table, flows) in tables {
            let entry = reads.entry(table).or_default();
            for flow in flows {
                entry.extend(through_views(flow_reads(flow)?, views));
            }
        }
        let members: BTreeSet<TableName> = reads.keys().cloned().collect();
        let upstream = reads
            .into_iter()
            .map(|(table, read)| {
                let read = read.intersection(&members).cloned().collect();
                (table, read)
            })
            .collect();
        Ok(Self { upstream })
    }

    /// The tables that read `table`, directly or not.
    pub fn downstream_of(&self, table: &TableName) -> BTreeSet<TableName> {
        let mut found = BTreeSet::new();
        let mut queue = VecDeque::from([table.clone()]);
        while let Some(t) = queue.pop_front() {
            for (reader, reads) in &self.upstream {
                if reads.contains(&t) && found.insert(reader.clone()) {
                    queue.push_back(reader.clone());
                }
            }
        }
        found
    }

    /// A path `from → … → to` along reads (`a → b`: b reads a), if any.
    pub fn path(&self, from: &TableName, to: &TableName) -> Option<Vec<TableName>> {
        let mut previous: BTreeMap<TableName, TableName> = BTreeMap::new();
        let mut queue = VecDeque::from([from.clone()]);
        while let Some(t) = queue.pop_front() {
            if &t == to {
                let mut path = vec![t.clone()];
                let mut at = t;
                while let Some(p) = previous.get(&at) {
                    path.push(p.clone());
                    at = p.clone();
                }
                path.reverse();
                return Some(path);
            }
            for (reader, reads) in &self.upstream {
                if reads.contains(&t) && reader != from && !previous.contains_key(reader) {
                    previous.insert(reader.clone(), t.clone());
                    queue.push_back(reader.clone());
                }
            }
        }
        None
    }

    /// Every table after the tables it reads (ties by name); an error
    /// naming the tables of a cycle if there is one.
    pub fn order(&self) -> Result<Vec<TableName>> {
        let mut waiting: BTreeMap<&TableName, usize> = self
            .upstream
            .iter()
            .map(|(t, reads)| (t, reads.iter().filter(|r| *r != t).count()))
            .collect();
        let mut ready: BTreeSet<&TableName> = waiting
            .iter()
            .filter(|(_, n)| **n == 0)
            .map(|(t, _)| *t)
            .collect();
        let mut order = Vec::with_capacity(waiting.len());
        while let Some(t) = ready.pop_first() {
            waiting.remove(t);
            order.push(t.clone());
            for (reader, reads) in &self.upstream {
                if reads.contains(t) && reader != t {
                    if let Some(n) = waiting.get_mut(reader) {
                        *n -= 1;
                        if *n == 0 {
                            ready.insert(reader);
                        }
                    }
                }
            }
        }
        if !waiting.is_empty() {
            let names: Vec<String> = waiting.keys().map(|t| t.to_string()).collect();
            return Err(DataFusionError::Plan(format!(
                "the pipeline has a cycle among {}",
                names.join(", ")
            )));
        }
        Ok(order)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flow(source: FlowSource) -> FlowSpec {
        FlowSpec::new("f", "t", source)
    }

    fn names(found: BTreeSet<TableName>) -> Vec<String> {
        found.into_iter().map(|t| t.to_string()).collect()
    }

    #[test]
    fn a_flow_reads_what_its_source_names() -> Result<()> {
        let read = |source| flow_reads(&flow(source)).map(names);
        assert_eq!(read(FlowSource::Table("Bronze".into()))?, ["bronze"]);
        assert_eq!(read(FlowSource::Table("s.\"Mixed\"".into()))?, ["s.Mixed"]);
        assert_eq!(
            read(FlowSource::Query(
                "WITH c AS (SELECT * FROM plain) SELECT * FROM STREAM a JOIN stream(s.b) ON true \
                 JOIN table_changes('c2', 0) ON true JOIN c ON true \
                 WHERE x IN (SELECT y FROM event_log('d'))"
                    .into()
            ))?,
            ["a", "c", "c2", "d", "plain", "s.b"]
        );
        assert_eq!(
            read(FlowSource::Snapshot {
                query: "SELECT * FROM snap".into(),
                version_query: Some("SELECT max(v) FROM versions".into()),
            })?,
            ["snap", "versions"]
        );
        assert!(read(FlowSource::SnapshotFunction)?.is_empty());
        Ok(())
    }

    #[test]
    fn tables_are_ordered_after_what_they_read_and_cycles_are_named() -> Result<()> {
        let t = |n: &str| TableName::parse(n).expect("a name");
        let reading = |sources: &[&str]| -> Vec<FlowSpec> {
            sources
                .iter()
                .map(|s| flow(FlowSource::Table(s.to_string())))
                .collect()
        };
        let (gold, silver, bronze, other) = (
            reading(&["silver", "bronze"]),
            reading(&["bronze"]),
            reading(&["raw"]),
            reading(&[]),
        );
        let graph = PipelineGraph::new([
            (t("gold"), gold.iter()),
            (t("silver"), silver.iter()),
            (t("bronze"), bronze.iter()),
            (t("alone"), other.iter()),
        ])?;
        let order: Vec<String> = graph.order()?.iter().map(|t| t.to_string()).collect();
        assert_eq!(order, ["alone", "bronze", "silver", "gold"]);
        assert_eq!(names(graph.downstream_of(&t("bronze"))), ["gold", "silver"]);
        let path: Vec<String> = graph
            .path(&t("bronze"), &t("gold"))
            .expect("a path")
            .iter()
            .map(|t| t.to_string())
            .collect();
        assert_eq!(path, ["bronze", "gold"]);
        assert!(graph.path(&t("gold"), &t("bronze")).is_none());

        let (a, b) = (reading(&["b"]), reading(&["a"]));
        let cyclic = PipelineGraph::new([(t("a"), a.iter()), (t("b"), b.iter())])?;
        let err = cyclic.order().expect_err("a cycle");
        assert!(err.to_string().contains("a cycle among a, b"), "{err}");
        Ok(())
    }
}
