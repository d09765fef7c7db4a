//! Debezium change events: JSON Lines as the PostgreSQL connector and Kafka
//! Connect's JSON converter write them, for a table
//! `public.accounts (id BIGINT PRIMARY KEY, name TEXT, amount NUMERIC(12, 2),
//! updated_at TIMESTAMP, day DATE)` with `REPLICA IDENTITY FULL`.
//!
//! Every line is formatted straight into one reused buffer — numbers by hand,
//! the envelope's schema one precomputed string — so 10 M events take seconds
//! of CPU, bounded by the disk.

use std::fs::{self, File};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use crate::rng::{mix64, Rng};
use crate::{check_fraction, Error, Result};

/// Parameters of a generated Debezium history.
///
/// The history runs over keys `0..keys` (column `id`). It starts with a
/// snapshot: one read event (`op = "r"`, `source.snapshot` `"true"`, `"last"`
/// for the final one) for each of the first `keys / 2` keys, which are then
/// live. Then `events` change events follow, each chosen at random:
///
/// * with probability `delete_fraction` a delete (`"d"`) of a live key:
///   `before` the full old row, `after` null; with `tombstones` a line `null`
///   follows it, as Kafka's log compaction expects;
/// * with probability `key_change_fraction` a primary-key change: an update
///   (`"u"`) whose `before` is a live key's old row and whose `after` is a row
///   of a key not live, which the old key's row moves to;
/// * with probability `create_fraction` a create (`"c"`) of a key not live;
/// * otherwise an update (`"u"`) of a live key, `before` its full old row.
///
/// (A delete or update with no live key becomes a create; a create or key
/// change with every key live becomes an update.) Events have strictly
/// increasing `source.lsn`, `source.ts_ms` and `ts_ms` in history order.
///
/// The events go to `files` files in history order, in contiguous chunks, but
/// the chunks are named `part-00000.json`, ... in a shuffled order, so a reader
/// must order by `source.lsn`, not by file name.
#[derive(Clone, Debug, PartialEq)]
pub struct DebeziumConfig {
    /// Change events after the snapshot (tombstones not counted).
    pub events: u64,
    /// Keys `0..keys`; the snapshot reads the first `keys / 2`.
    pub keys: u64,
    /// Output files (fewer when there are fewer lines than files).
    pub files: usize,
    /// Write each line as `{"schema": ..., "payload": ...}` (Kafka Connect's
    /// JSON converter with `schemas.enable`), else the payload alone.
    pub with_schema: bool,
    /// Share of change events that are deletes.
    pub delete_fraction: f64,
    /// Share of change events that are primary-key changes.
    pub key_change_fraction: f64,
    /// Share of change events that create a key.
    pub create_fraction: f64,
    /// Write a tombstone line `null` after each delete.
    pub tombstones: bool,
    /// Seed of every random choice: one seed, one history.
    pub seed: u64,
}

impl Default for DebeziumConfig {
    /// 1 M events over 200 k keys in 16 files with schemas, 5 % deletes, 5 %
    /// creates, no key changes and no tombstones.
    fn default() -> Self {
        Self {
            events: 1_000_000,
            keys: 200_000,
            files: 16,
            with_schema: true,
            delete_fraction: 0.05,
            key_change_fraction: 0.0,
            create_fraction: 0.05,
            tombstones: false,
            seed: 42,
        }
    }
}

impl DebeziumConfig {
    /// Checks every parameter.
    pub fn validate(&self) -> Result<()> {
        // (keys index in-memory arrays of u32)
        if self.keys == 0 || self.keys > u64::from(u32::MAX) {
            return Err(Error::Config(format!(
                "keys must be between 1 and {}, got {}",
                u32::MAX,
                self.keys
            )));
        }
        if self.events > (i64::MAX as u64) / 1024 {
            return Err(Error::Config(format!(
                "events must be at most {}, got {}",
                i64::MAX / 1024,
                self.events
            )));
        }
        if self.files == 0 || self.files > 100_000 {
            return Err(Error::Config(format!(
                "files must be between 1 and 100000, got {}",
                self.files
            )));
        }
        check_fraction("delete fraction", self.delete_fraction)?;
        check_fraction("key change fraction", self.key_change_fraction)?;
        check_fraction("create fraction", self.create_fraction)?;
        let sum = self.delete_fraction + self.key_change_fraction + self.create_fraction;
        if sum > 1.0 {
            return Err(Error::Config(format!(
                "deletes, key changes and creates must add up to at most 1, got {sum}"
            )));
        }
        Ok(())
    }
}

/// What a generated history contains.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DebeziumSummary {
    /// Lines written, tombstones included.
    pub lines: u64,
    /// Bytes written.
    pub bytes: u64,
    /// Files written.
    pub files: usize,
    /// Snapshot reads (`"r"`).
    pub reads: u64,
    /// Creates (`"c"`).
    pub creates: u64,
    /// Updates (`"u"`) that keep their key.
    pub updates: u64,
    /// Updates that change the key.
    pub key_changes: u64,
    /// Deletes (`"d"`).
    pub deletes: u64,
    /// Tombstone lines.
    pub tombstones: u64,
    /// Keys live at the end: the rows of the table the history leaves.
    pub live_keys: u64,
}

/// The name of output file `index`.
pub fn debezium_file_name(index: usize) -> String {
    format!("part-{index:05}.json")
}

/// Writes the history described by `config` into the folder `dir` (created if
/// missing; `part-*.json` files already there are removed first) and returns
/// what it contains.
///
/// Memory: 16 bytes per key, whatever `events` is.
pub fn write_debezium(config: &DebeziumConfig, dir: &Path) -> Result<DebeziumSummary> {
    config.validate()?;
    fs::create_dir_all(dir)?;
    for entry in fs::read_dir(dir)? {
        let path = entry?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name.starts_with("part-") && name.ends_with(".json") {
            fs::remove_file(&path)?;
        }
    }

    let initial = config.keys / 2;
    let total = initial + config.events;
    let files = (config.files as u64).min(total.max(1)) as usize;
    let names = shuffled_names(files, config.seed);
    let mut out = Output {
        dir: dir.to_path_buf(),
        names,
        current: None,
        file: 0,
        bytes: 0,
    };
    let mut keys = Keys::new(config.keys);
    let mut line = Line::new(config);
    let mut rng = Rng::new(config.seed, 11);
    let mut summary = DebeziumSummary {
        files,
        ..DebeziumSummary::default()
    };

    for event in 0..total {
        // contiguous chunks of the history, file by file
        let file = (u128::from(event) * files as u128 / u128::from(total)) as usize;
        let sink = out.sink(file)?;
        if event < initial {
            let id = event;
            keys.make_live(id, event);
            let snapshot = if event + 1 == initial { "last" } else { "true" };
            line.event(event, b'r', snapshot, None, Some((id, event)));
            summary.reads += 1;
            sink.write_all(line.bytes())?;
            continue;
        }
        let u = rng.unit();
        let mut kind = if u < config.delete_fraction {
            Kind::Delete
        } else if u < config.delete_fraction + config.key_change_fraction {
            Kind::KeyChange
        } else if u < config.delete_fraction + config.key_change_fraction + config.create_fraction {
            Kind::Create
        } else {
            Kind::Update
        };
        if keys.live == 0 {
            kind = Kind::Create;
        } else if keys.live == config.keys && matches!(kind, Kind::Create | Kind::KeyChange) {
            kind = Kind::Update;
        }
        match kind {
            Kind::Create => {
                let id = keys.random_free(&mut rng);
                keys.make_live(id, event);
                line.event(event, b'c', "false", None, Some((id, event)));
                summary.creates += 1;
            }
            Kind::Update => {
                let id = keys.random_live(&mut rng);
                let old = keys.version(id);
                keys.set_version(id, event);
                line.event(event, b'u', "false", Some((id, old)), Some((id, event)));
                summary.updates += 1;
            }
            Kind::KeyChange => {
                let old_id = keys.random_live(&mut rng);
                let new_id = keys.random_free(&mut rng);
                let old = keys.version(old_id);
                keys.make_free(old_id);
                keys.make_live(new_id, event);
                line.event(
                    event,
                    b'u',
                    "false",
                    Some((old_id, old)),
                    Some((new_id, event)),
                );
                summary.key_changes += 1;
            }
            Kind::Delete => {
                let id = keys.random_live(&mut rng);
                let old = keys.version(id);
                keys.make_free(id);
                line.event(event, b'd', "false", Some((id, old)), None);
                summary.deletes += 1;
                if config.tombstones {
                    line.tombstone();
                    summary.tombstones += 1;
                }
            }
        }
        sink.write_all(line.bytes())?;
    }
    out.finish()?;
    summary.lines = total + summary.tombstones;
    summary.bytes = out.bytes;
    summary.live_keys = keys.live;
    Ok(summary)
}

/// The kinds of change event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Create,
    Update,
    KeyChange,
    Delete,
}

/// The output files, one open at a time.
struct Output {
    dir: PathBuf,
    /// The name of each chunk of the history, in history order.
    names: Vec<String>,
    current: Option<BufWriter<File>>,
    /// The chunk being written.
    file: usize,
    bytes: u64,
}

impl Output {
    /// The writer of chunk `file`, opening it (and the chunks before it, so
    /// none is missing) when it is not the current one.
    fn sink(&mut self, file: usize) -> Result<&mut BufWriter<File>> {
        while self.current.is_none() || self.file < file {
            if self.current.is_some() {
                self.close()?;
                self.file += 1;
            }
            let path = self.dir.join(&self.names[self.file]);
            let created = File::create(&path).map_err(|error| {
                Error::Io(std::io::Error::new(
                    error.kind(),
                    format!("cannot create {}: {error}", path.display()),
                ))
            })?;
            self.current = Some(BufWriter::with_capacity(1 << 20, created));
        }
        match self.current.as_mut() {
            Some(writer) => Ok(writer),
            None => unreachable!("a file was just opened"),
        }
    }

    fn close(&mut self) -> Result<()> {
        if let Some(mut writer) = self.current.take() {
            writer.flush()?;
            self.bytes += writer.get_ref().metadata()?.len();
        }
        Ok(())
    }

    /// Closes the last file and creates any chunk not yet written (empty).
    fn finish(&mut self) -> Result<()> {
        self.close()?;
        for name in &self.names[self.file..] {
            let path = self.dir.join(name);
            if !path.exists() {
                File::create(path)?;
            }
        }
        Ok(())
    }
}

/// The file names of `files` chunks: a random permutation of `part-00000.json`
/// ... that is never the identity when there are two chunks or more.
fn shuffled_names(files: usize, seed: u64) -> Vec<String> {
    let mut order: Vec<usize> = (0..files).collect();
    let mut rng = Rng::new(seed, 12);
    for i in (1..files).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        order.swap(i, j);
    }
    if files > 1 && order.iter().enumerate().all(|(i, o)| i == *o) {
        order.swap(0, files - 1);
    }
    order.into_iter().map(debezium_file_name).collect()
}

/// Which keys are live, and the event that last wrote each.
///
/// `slots` holds every key, the live ones first (`slots[..live]`); `position`
/// is the inverse permutation, so picking a random live or free key and moving
/// a key between the two sets are O(1).
struct Keys {
    slots: Vec<u32>,
    position: Vec<u32>,
    /// The event that wrote each key's current row (its values are derived
    /// from it).
    versions: Vec<u64>,
    live: u64,
}

impl Keys {
    fn new(keys: u64) -> Self {
        let n = keys as usize;
        Self {
            slots: (0..keys as u32).collect(),
            position: (0..keys as u32).collect(),
            versions: vec![0; n],
            live: 0,
        }
    }

    fn version(&self, id: u64) -> u64 {
        self.versions[id as usize]
    }

    fn set_version(&mut self, id: u64, event: u64) {
        self.versions[id as usize] = event;
    }

    fn random_live(&self, rng: &mut Rng) -> u64 {
        u64::from(self.slots[rng.below(self.live) as usize])
    }

    fn random_free(&self, rng: &mut Rng) -> u64 {
        let free = self.slots.len() as u64 - self.live;
        u64::from(self.slots[(self.live + rng.below(free)) as usize])
    }

    /// Moves key `id` to slot `to`, and the key there to `id`'s slot.
    fn swap(&mut self, id: u64, to: usize) {
        let from = self.position[id as usize] as usize;
        let other = self.slots[to];
        self.slots.swap(from, to);
        self.position[id as usize] = to as u32;
        self.position[other as usize] = from as u32;
    }

    /// Makes the free key `id` live, its row written by `event`.
    fn make_live(&mut self, id: u64, event: u64) {
        self.swap(id, self.live as usize);
        self.live += 1;
        self.versions[id as usize] = event;
    }

    /// Makes the live key `id` free.
    fn make_free(&mut self, id: u64) {
        self.live -= 1;
        self.swap(id, self.live as usize);
    }
}

/// 2024-01-01T00:00:00Z in milliseconds since the epoch: the first event's
/// `ts_ms`.
const BASE_MS: i64 = 1_704_067_200_000;
/// `2024-01-01` in days since the epoch.
const BASE_DAY: i64 = 19_723;
/// The first event's LSN; each event's is 128 to 255 bytes after the previous.
const BASE_LSN: i64 = 0x0200_0000;
/// The transaction of the snapshot; each change event is a transaction of its
/// own, numbered from one after it.
const SNAPSHOT_TX: i64 = 750;
/// Distinct names (`name-00000` ...).
const NAMES: u64 = 50_000;

/// A row's column values: a function of the event that wrote it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Row {
    pub(crate) id: i64,
    pub(crate) name: u64,
    /// `amount * 100`, the Decimal's unscaled value: -100 000 000.00 to
    /// 899 999 999.99, so precision 12 holds it.
    pub(crate) amount: i64,
    /// Microseconds since the epoch.
    pub(crate) updated_at: i64,
    /// Days since the epoch.
    pub(crate) day: i64,
}

impl Row {
    /// The row of key `id` written by event `event` under `seed`.
    pub(crate) fn new(seed: u64, id: u64, event: u64) -> Self {
        let bits = mix64(seed ^ mix64(event.wrapping_mul(0x2545_f491_4f6c_dd1d) ^ 0x5bd1));
        Row {
            id: id as i64,
            name: bits % NAMES,
            amount: ((bits >> 17) % 100_000_000_000) as i64 - 10_000_000_000,
            updated_at: (BASE_MS + event as i64) * 1000 + ((bits >> 7) % 1000) as i64,
            day: BASE_DAY + ((bits >> 50) % 366) as i64,
        }
    }
}

/// The LSN of event `event` (strictly increasing).
fn lsn(seed: u64, event: u64) -> i64 {
    BASE_LSN + 128 * event as i64 + (mix64(seed ^ event ^ 0x15a) % 128) as i64
}

/// Formats one line into a reused buffer.
struct Line {
    buf: Vec<u8>,
    /// `{"schema":...,"payload":` when lines carry the schema, else empty.
    prefix: Vec<u8>,
    seed: u64,
}

impl Line {
    fn new(config: &DebeziumConfig) -> Self {
        let prefix = if config.with_schema {
            format!("{{\"schema\":{},\"payload\":", envelope_schema()).into_bytes()
        } else {
            Vec::new()
        };
        Self {
            buf: Vec::with_capacity(4096),
            prefix,
            seed: config.seed,
        }
    }

    fn bytes(&self) -> &[u8] {
        &self.buf
    }

    /// Formats event number `event` (a line ending in `\n`): `before` and
    /// `after` are rows as (key, event that wrote them).
    fn event(
        &mut self,
        event: u64,
        op: u8,
        snapshot: &str,
        before: Option<(u64, u64)>,
        after: Option<(u64, u64)>,
    ) {
        let lsn = lsn(self.seed, event);
        let ts_ms = BASE_MS + event as i64;
        let tx = if snapshot == "false" {
            SNAPSHOT_TX + 1 + event as i64
        } else {
            SNAPSHOT_TX
        };
        let b = &mut self.buf;
        b.clear();
        b.extend_from_slice(&self.prefix);
        b.extend_from_slice(b"{\"before\":");
        push_row(b, before.map(|(id, e)| Row::new(self.seed, id, e)));
        b.extend_from_slice(b",\"after\":");
        push_row(b, after.map(|(id, e)| Row::new(self.seed, id, e)));
        b.extend_from_slice(
            b",\"source\":{\"version\":\"2.7.0.Final\",\"connector\":\"postgresql\",\
              \"name\":\"bench\",\"ts_ms\":",
        );
        push_int(b, ts_ms);
        b.extend_from_slice(b",\"snapshot\":\"");
        b.extend_from_slice(snapshot.as_bytes());
        b.extend_from_slice(b"\",\"db\":\"bench\",\"sequence\":\"[null,\\\"");
        push_int(b, lsn);
        b.extend_from_slice(b"\\\"]\",\"schema\":\"public\",\"table\":\"accounts\",\"txId\":");
        push_int(b, tx);
        b.extend_from_slice(b",\"lsn\":");
        push_int(b, lsn);
        b.extend_from_slice(b",\"xmin\":null},\"op\":\"");
        b.push(op);
        b.extend_from_slice(b"\",\"ts_ms\":");
        // (the connector's processing time: a little after the commit)
        push_int(b, ts_ms + 3);
        b.extend_from_slice(b",\"transaction\":null}");
        if !self.prefix.is_empty() {
            b.push(b'}');
        }
        b.push(b'\n');
    }

    /// Appends a tombstone line to the event in the buffer.
    fn tombstone(&mut self) {
        self.buf.extend_from_slice(b"null\n");
    }
}

/// Appends a row as a JSON object, or `null`.
fn push_row(b: &mut Vec<u8>, row: Option<Row>) {
    let Some(row) = row else {
        b.extend_from_slice(b"null");
        return;
    };
    b.extend_from_slice(b"{\"id\":");
    push_int(b, row.id);
    b.extend_from_slice(b",\"name\":\"name-");
    let mut digits = [b'0'; 5];
    let mut rest = row.name;
    for digit in digits.iter_mut().rev() {
        *digit = b'0' + (rest % 10) as u8;
        rest /= 10;
    }
    b.extend_from_slice(&digits);
    b.extend_from_slice(b"\",\"amount\":\"");
    push_base64(b, decimal_bytes(row.amount).as_slice());
    b.extend_from_slice(b"\",\"updated_at\":");
    push_int(b, row.updated_at);
    b.extend_from_slice(b",\"day\":");
    push_int(b, row.day);
    b.push(b'}');
}

/// Appends `value` in decimal.
fn push_int(b: &mut Vec<u8>, value: i64) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    let mut rest = value.unsigned_abs();
    loop {
        at -= 1;
        digits[at] = b'0' + (rest % 10) as u8;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    if value < 0 {
        b.push(b'-');
    }
    b.extend_from_slice(&digits[at..]);
}

/// The bytes of a Kafka Connect Decimal: the unscaled value in big-endian
/// two's complement, as few bytes as hold it with its sign (Java's
/// `BigInteger.toByteArray`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct DecimalBytes {
    bytes: [u8; 8],
    start: usize,
}

impl DecimalBytes {
    pub(crate) fn as_slice(&self) -> &[u8] {
        &self.bytes[self.start..]
    }
}

pub(crate) fn decimal_bytes(unscaled: i64) -> DecimalBytes {
    let bytes = unscaled.to_be_bytes();
    let mut start = 0;
    // a leading byte is redundant when it only repeats the next byte's sign bit
    while start < 7 {
        let (lead, next) = (bytes[start], bytes[start + 1]);
        if (lead == 0x00 && next & 0x80 == 0) || (lead == 0xff && next & 0x80 != 0) {
            start += 1;
        } else {
            break;
        }
    }
    DecimalBytes { bytes, start }
}

/// Appends `data` in standard base64 with padding.
fn push_base64(b: &mut Vec<u8>, data: &[u8]) {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for chunk in data.chunks(3) {
        let n = (u32::from(chunk[0]) << 16)
            | (u32::from(chunk.get(1).copied().unwrap_or(0)) << 8)
            | u32::from(chunk.get(2).copied().unwrap_or(0));
        b.push(ALPHABET[(n >> 18) as usize & 63]);
        b.push(ALPHABET[(n >> 12) as usize & 63]);
        b.push(if chunk.len() > 1 {
            ALPHABET[(n >> 6) as usize & 63]
        } else {
            b'='
        });
        b.push(if chunk.len() > 2 {
            ALPHABET[n as usize & 63]
        } else {
            b'='
        });
    }
}

/// The schema of the envelope, as the JSON converter writes it with
/// `schemas.enable=true`.
pub fn envelope_schema() -> String {
    let row = |field: &str| {
        format!(
            concat!(
                "{{\"type\":\"struct\",\"fields\":[",
                "{{\"type\":\"int64\",\"optional\":false,\"field\":\"id\"}},",
                "{{\"type\":\"string\",\"optional\":true,\"field\":\"name\"}},",
                "{{\"type\":\"bytes\",\"optional\":true,",
                "\"name\":\"org.apache.kafka.connect.data.Decimal\",\"version\":1,",
                "\"parameters\":{{\"scale\":\"2\",\"connect.decimal.precision\":\"12\"}},",
                "\"field\":\"amount\"}},",
                "{{\"type\":\"int64\",\"optional\":true,",
                "\"name\":\"io.debezium.time.MicroTimestamp\",\"version\":1,",
                "\"field\":\"updated_at\"}},",
                "{{\"type\":\"int32\",\"optional\":true,",
                "\"name\":\"io.debezium.time.Date\",\"version\":1,\"field\":\"day\"}}",
                "],\"optional\":true,\"name\":\"bench.public.accounts.Value\",",
                "\"field\":\"{}\"}}"
            ),
            field
        )
    };
    let source = concat!(
        "{\"type\":\"struct\",\"fields\":[",
        "{\"type\":\"string\",\"optional\":false,\"field\":\"version\"},",
        "{\"type\":\"string\",\"optional\":false,\"field\":\"connector\"},",
        "{\"type\":\"string\",\"optional\":false,\"field\":\"name\"},",
        "{\"type\":\"int64\",\"optional\":false,\"field\":\"ts_ms\"},",
        "{\"type\":\"string\",\"optional\":true,\"name\":\"io.debezium.data.Enum\",",
        "\"version\":1,\"parameters\":{\"allowed\":\"true,last,false,incremental\"},",
        "\"default\":\"false\",\"field\":\"snapshot\"},",
        "{\"type\":\"string\",\"optional\":false,\"field\":\"db\"},",
        "{\"type\":\"string\",\"optional\":true,\"field\":\"sequence\"},",
        "{\"type\":\"string\",\"optional\":false,\"field\":\"schema\"},",
        "{\"type\":\"string\",\"optional\":false,\"field\":\"table\"},",
        "{\"type\":\"int64\",\"optional\":true,\"field\":\"txId\"},",
        "{\"type\":\"int64\",\"optional\":true,\"field\":\"lsn\"},",
        "{\"type\":\"int64\",\"optional\":true,\"field\":\"xmin\"}",
        "],\"optional\":false,\"name\":\"io.debezium.connector.postgresql.Source\",",
        "\"field\":\"source\"}"
    );
    let transaction = concat!(
        "{\"type\":\"struct\",\"fields\":[",
        "{\"type\":\"string\",\"optional\":false,\"field\":\"id\"},",
        "{\"type\":\"int64\",\"optional\":false,\"field\":\"total_order\"},",
        "{\"type\":\"int64\",\"optional\":false,\"field\":\"data_collection_order\"}",
        "],\"optional\":true,\"name\":\"event.block\",\"version\":1,",
        "\"field\":\"transaction\"}"
    );
    format!(
        concat!(
            "{{\"type\":\"struct\",\"fields\":[{},{},{},",
            "{{\"type\":\"string\",\"optional\":false,\"field\":\"op\"}},",
            "{{\"type\":\"int64\",\"optional\":true,\"field\":\"ts_ms\"}},{}",
            "],\"optional\":false,\"name\":\"bench.public.accounts.Envelope\",\"version\":1}}"
        ),
        row("before"),
        row("after"),
        source,
        transaction
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{HashMap, HashSet};

    use serde_json::Value;

    fn small(events: u64) -> DebeziumConfig {
        DebeziumConfig {
            events,
            keys: 500,
            files: 7,
            key_change_fraction: 0.05,
            ..DebeziumConfig::default()
        }
    }

    /// Generates into a temporary folder; returns the summary, the files' names
    /// in the folder and every line parsed, in the files' history order.
    fn generate(config: &DebeziumConfig) -> (DebeziumSummary, Vec<String>, Vec<Value>) {
        let dir = tempfile::tempdir().expect("temp dir");
        let summary = write_debezium(config, dir.path()).expect("generate");
        let mut names: Vec<String> = fs::read_dir(dir.path())
            .expect("list")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        let history = shuffled_names(summary.files, config.seed);
        let mut lines = Vec::new();
        for name in &history {
            let text = fs::read_to_string(dir.path().join(name)).expect("read");
            for line in text.lines() {
                lines.push(serde_json::from_str(line).expect("a JSON line"));
            }
        }
        (summary, names, lines)
    }

    /// The payload of a line (the line itself without schema).
    fn payload(line: &Value) -> &Value {
        line.get("payload").unwrap_or(line)
    }

    fn decode_base64(text: &str) -> Vec<u8> {
        let value = |c: u8| match c {
            b'A'..=b'Z' => u32::from(c - b'A'),
            b'a'..=b'z' => u32::from(c - b'a') + 26,
            b'0'..=b'9' => u32::from(c - b'0') + 52,
            b'+' => 62,
            b'/' => 63,
            _ => panic!("not base64: {c}"),
        };
        let mut out = Vec::new();
        for chunk in text.as_bytes().chunks(4) {
            let pad = chunk.iter().filter(|c| **c == b'=').count();
            let n = chunk
                .iter()
                .map(|c| if *c == b'=' { 0 } else { value(*c) })
                .fold(0u32, |n, v| (n << 6) | v);
            let bytes = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
            out.extend_from_slice(&bytes[..3 - pad]);
        }
        out
    }

    /// The unscaled value of big-endian two's-complement bytes.
    fn decode_decimal(bytes: &[u8]) -> i64 {
        let negative = bytes.first().is_some_and(|b| b & 0x80 != 0);
        bytes.iter().fold(if negative { -1i64 } else { 0 }, |n, b| {
            (n << 8) | i64::from(*b)
        })
    }

    #[test]
    fn decimals_round_trip() {
        for unscaled in [
            0,
            1,
            -1,
            127,
            128,
            -128,
            -129,
            255,
            256,
            32_767,
            -32_768,
            99_999_999_999,
            -10_000_000_000,
            i64::MAX,
            i64::MIN,
        ] {
            let mut text = Vec::new();
            push_base64(&mut text, decimal_bytes(unscaled).as_slice());
            let bytes = decode_base64(std::str::from_utf8(&text).expect("ascii"));
            assert_eq!(bytes, decimal_bytes(unscaled).as_slice());
            assert_eq!(decode_decimal(&bytes), unscaled, "{unscaled}");
        }
        assert_eq!(decimal_bytes(0).as_slice(), [0]);
        assert_eq!(decimal_bytes(128).as_slice(), [0, 128]);
        assert_eq!(decimal_bytes(-128).as_slice(), [128]);
        let mut text = Vec::new();
        push_base64(&mut text, decimal_bytes(12_345).as_slice());
        assert_eq!(text, b"MDk=");
    }

    #[test]
    fn generated_decimals_decode_to_the_rows() {
        let config = DebeziumConfig {
            with_schema: false,
            ..small(2_000)
        };
        let (_, _, lines) = generate(&config);
        let mut negative = 0;
        for line in &lines {
            let Some(after) = line.get("after").filter(|a| !a.is_null()) else {
                continue;
            };
            let id = after["id"].as_u64().expect("id");
            let lsn = line["source"]["lsn"].as_i64().expect("lsn");
            let event = ((lsn - BASE_LSN) / 128) as u64;
            let row = Row::new(config.seed, id, event);
            let amount = decode_decimal(&decode_base64(after["amount"].as_str().expect("b64")));
            assert_eq!(amount, row.amount);
            assert!(amount.abs() < 1_000_000_000_000, "fits decimal(12, 2)");
            negative += usize::from(amount < 0);
            assert_eq!(after["updated_at"].as_i64(), Some(row.updated_at));
        }
        assert!(negative > 0, "no negative amount generated");
    }

    #[test]
    fn lsn_and_timestamps_increase_in_history_order() {
        let (summary, names, lines) = generate(&small(3_000));
        assert_eq!(lines.len() as u64, summary.lines);
        assert_eq!(summary.reads, 250);
        assert_eq!(
            summary.reads
                + summary.creates
                + summary.updates
                + summary.key_changes
                + summary.deletes,
            250 + 3_000
        );
        let mut last = (i64::MIN, i64::MIN, i64::MIN);
        for line in &lines {
            let p = payload(line);
            let now = (
                p["source"]["lsn"].as_i64().expect("lsn"),
                p["source"]["ts_ms"].as_i64().expect("ts"),
                p["ts_ms"].as_i64().expect("ts"),
            );
            assert!(now.0 > last.0 && now.1 > last.1 && now.2 > last.2);
            last = now;
        }
        // every file exists; their names are not in history order
        assert_eq!(names, (0..7).map(debezium_file_name).collect::<Vec<_>>());
        assert_ne!(shuffled_names(7, 42), names);
    }

    #[test]
    fn a_key_change_moves_a_live_row_to_a_free_key() {
        let (summary, _, lines) = generate(&small(5_000));
        assert!(summary.key_changes > 0);
        let mut live: HashMap<i64, Value> = HashMap::new();
        let mut changes = 0;
        for line in &lines {
            let p = payload(line);
            let (before, after) = (&p["before"], &p["after"]);
            let id = |row: &Value| row["id"].as_i64().expect("id");
            match p["op"].as_str().expect("op") {
                "r" | "c" => {
                    assert!(before.is_null());
                    assert!(live.insert(id(after), after.clone()).is_none());
                }
                "u" => {
                    // the full old row is the key's current row
                    assert_eq!(live.remove(&id(before)).as_ref(), Some(before));
                    if id(before) != id(after) {
                        changes += 1;
                        assert!(!live.contains_key(&id(after)), "moved onto a live key");
                    }
                    live.insert(id(after), after.clone());
                }
                "d" => {
                    assert!(after.is_null());
                    assert_eq!(live.remove(&id(before)).as_ref(), Some(before));
                }
                op => panic!("unexpected op {op}"),
            }
        }
        assert_eq!(changes, summary.key_changes);
        assert_eq!(live.len() as u64, summary.live_keys);
    }

    #[test]
    fn lines_carry_the_schema_unless_asked_not_to() {
        let (_, _, with) = generate(&small(50));
        let schema = &with[0]["schema"];
        assert_eq!(schema["name"], "bench.public.accounts.Envelope");
        let fields: Vec<&str> = schema["fields"]
            .as_array()
            .expect("fields")
            .iter()
            .map(|f| f["field"].as_str().expect("field"))
            .collect();
        assert_eq!(
            fields,
            ["before", "after", "source", "op", "ts_ms", "transaction"]
        );
        assert_eq!(schema["fields"][1]["fields"][2]["parameters"]["scale"], "2");
        assert!(with.iter().all(|l| l["payload"]["op"].is_string()));

        let (_, _, without) = generate(&DebeziumConfig {
            with_schema: false,
            ..small(50)
        });
        assert!(without
            .iter()
            .all(|l| l.is_object() && l["op"].is_string() && l.get("schema").is_none()));
        // the same history either way
        assert_eq!(
            with.iter()
                .map(|l| l["payload"].clone())
                .collect::<Vec<_>>(),
            without
        );
        assert_eq!(without[0]["source"]["snapshot"], "true");
        assert_eq!(without[249]["source"]["snapshot"], "last");
        assert_eq!(without[250]["source"]["snapshot"], "false");
        assert_eq!(
            without[0]["source"]["sequence"].as_str().map(|s| &s[..6]),
            Some("[null,")
        );
    }

    #[test]
    fn tombstones_follow_deletes_when_asked() {
        let config = DebeziumConfig {
            tombstones: true,
            with_schema: false,
            ..small(2_000)
        };
        let (summary, _, lines) = generate(&config);
        assert!(summary.deletes > 0);
        assert_eq!(summary.tombstones, summary.deletes);
        let mut tombstones = 0;
        for pair in lines.windows(2) {
            if pair[1].is_null() {
                tombstones += 1;
                assert_eq!(pair[0]["op"], "d");
            }
        }
        assert_eq!(tombstones, summary.tombstones);

        let (plain, _, lines) = generate(&DebeziumConfig {
            tombstones: false,
            ..config
        });
        assert_eq!(plain.tombstones, 0);
        assert!(lines.iter().all(|l| !l.is_null()));
    }

    #[test]
    fn one_seed_one_history_and_bad_parameters() {
        let (_, _, a) = generate(&small(300));
        let (_, _, b) = generate(&small(300));
        let (_, _, c) = generate(&DebeziumConfig {
            seed: 7,
            ..small(300)
        });
        assert_eq!(a, b);
        assert_ne!(a, c);
        let ids: HashSet<i64> = a
            .iter()
            .filter_map(|l| payload(l)["after"]["id"].as_i64())
            .collect();
        assert!(ids.iter().all(|id| (0..500).contains(id)));

        for bad in [
            DebeziumConfig {
                keys: 0,
                ..small(10)
            },
            DebeziumConfig {
                files: 0,
                ..small(10)
            },
            DebeziumConfig {
                delete_fraction: 0.6,
                create_fraction: 0.6,
                ..small(10)
            },
        ] {
            let dir = tempfile::tempdir().expect("temp dir");
            let error = write_debezium(&bad, dir.path()).expect_err("rejected");
            assert!(matches!(error, Error::Config(_)), "{error}");
        }
    }
}
