//! What the warehouse's store knows of a Delta log's listing right after
//! this process committed to it: deltalake's listing of the log after its
//! own commit is answered without a request.
//!
//! Why: a deltalake commit lists the log twice, once before its put (to
//! pick the version: the latest listed from the version it read, plus one)
//! and once after (to load the version it wrote, listing every commit since
//! the last checkpoint). A statement commits to the state store and then to
//! the published table, so on an object store two of its round trips are
//! listings whose answer the store already has: the first listing, plus the
//! commit file it just put. For the first to serve the second, it is made
//! from the offset of the log's previous listing (the last checkpoint's
//! commit, as the second asks), not from the version read.
//!
//! That answer is exact. Commit versions are dense and a commit file is
//! written only if absent, so when a listing names version `N - 1` as the
//! latest and the put of version `N` then succeeds, no other commit up to
//! `N` can have appeared in between; later commits by other writers are
//! left out, as in a listing made the moment the put returned. What a
//! listing cannot tell (files deleted by another process, a table dropped
//! and created again) is bounded by [`FRESH`]: the listing must be that
//! recent when the put succeeds, and the answer is given only that soon
//! after it, once.
//!
//! | event (in the store) | what is known of the log |
//! |---|---|
//! | a listing of a `_delta_log` folder read to its end | the listing: its offset, what it named, when |
//! | put-if-absent of commit `N`, succeeded, the listing known names `N - 1` as its latest commit and is at most [`FRESH`] old | the listing plus `N`, to answer the next listing |
//! | a listing of the log, at an offset at or after the known one's, within [`FRESH`] of the commit | answered from it once; its offset stays known |
//! | a listing of the log from a later offset than the known one's | made from the known one's offset instead (one request either way), answered from its part past the offset asked |
//! | a commit's put starting in the log | an answer not given yet is forgotten, its offset stays known |
//! | any other put starting in the log | everything forgotten |
//! | any other write, a failed put, a copy, rename or delete in the log | everything forgotten |
//!
//! Pure: the store ([`super::log_cache`]) reports what it sees and asks for
//! answers; the clock is passed in.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use object_store::path::Path;
use object_store::ObjectMeta;

/// How old a listing may be when a commit is put after it, and how soon
/// after the commit the next listing must come to be answered from it.
pub(crate) const FRESH: Duration = Duration::from_secs(2);

/// Listings naming more objects than this are not kept.
const MAX_NAMED: usize = 4096;

/// Logs known at most (past it, all are forgotten: a cache, not a catalog).
const MAX_LOGS: usize = 256;

/// A complete listing of a log folder.
#[derive(Debug, Clone)]
struct Listing {
    /// The offset it was made from (`None`: the whole folder).
    offset: Option<Path>,
    /// What it named, in path order.
    named: Vec<ObjectMeta>,
    /// When it was made (a listing) or when the commit was put (an answer).
    at: Instant,
}

/// What is known of one log.
#[derive(Debug)]
enum Known {
    /// Its last complete listing.
    Listed(Listing),
    /// Its last listing plus the commit this process put after it: the
    /// answer to the next listing.
    Committed(Listing),
    /// Only the offset its last listing was made from (an answer given,
    /// or not given before the next commit's put).
    Offset(Option<Path>),
}

impl Known {
    /// The offset the log's last listing was made from.
    fn offset(&self) -> &Option<Path> {
        match self {
            Known::Listed(listing) | Known::Committed(listing) => &listing.offset,
            Known::Offset(offset) => offset,
        }
    }
}

/// What the store knows of the Delta logs it listed (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct Listings {
    logs: HashMap<Path, Known>,
}

impl Listings {
    /// Whether `prefix` is a Delta log folder (the only listings kept).
    pub(crate) fn is_log(prefix: &Path) -> bool {
        prefix.filename() == Some("_delta_log")
    }

    /// A listing of log folder `prefix` from `offset` was read to its end
    /// at `now`, naming `named`.
    pub(crate) fn listed(
        &mut self,
        prefix: &Path,
        offset: Option<&Path>,
        mut named: Vec<ObjectMeta>,
        now: Instant,
    ) {
        if !Self::is_log(prefix) || named.len() > MAX_NAMED {
            self.logs.remove(prefix);
            return;
        }
        if self.logs.len() >= MAX_LOGS && !self.logs.contains_key(prefix) {
            self.logs.clear();
        }
        named.sort_unstable_by(|a, b| a.location.cmp(&b.location));
        let listing = Listing {
            offset: offset.cloned(),
            named,
            at: now,
        };
        self.logs.insert(prefix.clone(), Known::Listed(listing));
    }

    /// A put to `location` starts: an answer not given yet for its log is
    /// forgotten (a commit's put keeps the listing it was chosen from);
    /// any other write forgets the log.
    pub(crate) fn putting(&mut self, location: &Path, commit: bool) {
        let Some(log) = self.log_of(location) else {
            return;
        };
        match self.logs.remove(&log) {
            Some(known @ Known::Listed(_)) if commit => {
                self.logs.insert(log, known);
            }
            Some(known) if commit => {
                self.logs.insert(log, Known::Offset(known.offset().clone()));
            }
            _ => {}
        }
    }

    /// This store's put-if-absent of commit file `commit` (version
    /// `version`) succeeded at `now`.
    pub(crate) fn committed(&mut self, commit: &ObjectMeta, version: u64, now: Instant) {
        let Some(log) = self.log_of(&commit.location) else {
            return;
        };
        let listing = match self.logs.remove(&log) {
            Some(Known::Listed(listing)) => listing,
            Some(known) => {
                self.logs.insert(log, Known::Offset(known.offset().clone()));
                return;
            }
            None => return,
        };
        let latest = listing
            .named
            .iter()
            .filter_map(|meta| commit_version(&meta.location))
            .max();
        let recent = now.saturating_duration_since(listing.at) <= FRESH;
        if !recent || version == 0 || latest != Some(version - 1) {
            return;
        }
        let mut named = listing.named;
        named.push(commit.clone());
        named.sort_unstable_by(|a, b| a.location.cmp(&b.location));
        let answer = Listing {
            offset: listing.offset,
            named,
            at: now,
        };
        self.logs.insert(log, Known::Committed(answer));
    }

    /// Anything else changed at `location` (a failed put, a copy, rename
    /// or delete): its log is forgotten.
    pub(crate) fn changed(&mut self, location: &Path) {
        self.logs.retain(|log, _| !location.prefix_matches(log));
    }

    /// The answer to a listing of `prefix` from `offset` at `now`, if known
    /// (given once).
    pub(crate) fn answer(
        &mut self,
        prefix: &Path,
        offset: Option<&Path>,
        now: Instant,
    ) -> Option<Vec<ObjectMeta>> {
        let Some(Known::Committed(answer)) = self.logs.get(prefix) else {
            return None;
        };
        let covered = match (&answer.offset, offset) {
            (None, _) => true,
            (Some(known), Some(asked)) => asked >= known,
            (Some(_), None) => false,
        };
        if !covered || now.saturating_duration_since(answer.at) > FRESH {
            return None;
        }
        let offset_known = Known::Offset(answer.offset.clone());
        let Some(Known::Committed(answer)) = self.logs.insert(prefix.clone(), offset_known) else {
            return None;
        };
        Some(
            answer
                .named
                .into_iter()
                .filter(|meta| offset.is_none_or(|offset| &meta.location > offset))
                .collect(),
        )
    }

    /// Where to list log folder `prefix` from when asked from `offset`:
    /// the offset of its known listing, when that is earlier (so that the
    /// listing after a commit can be answered, see the module docs).
    /// `None`: from `offset`; `Some(None)`: the whole folder.
    pub(crate) fn list_from(&self, prefix: &Path, offset: &Path) -> Option<Option<Path>> {
        match self.logs.get(prefix)?.offset() {
            Some(from) if from >= offset => None,
            from => Some(from.clone()),
        }
    }

    /// The log folder known that holds `location`, if any.
    fn log_of(&self, location: &Path) -> Option<Path> {
        self.logs
            .keys()
            .find(|log| location.prefix_matches(log) && location != *log)
            .cloned()
    }
}

/// The version of a commit file `…/_delta_log/<20 digits>.json`.
pub(crate) fn commit_version(location: &Path) -> Option<u64> {
    let digits = location.filename()?.strip_suffix(".json")?;
    if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOG: &str = "t/_delta_log";

    fn meta(name: &str) -> ObjectMeta {
        ObjectMeta {
            location: Path::from(format!("{LOG}/{name}")),
            last_modified: chrono::Utc::now(),
            size: 10,
            e_tag: Some(name.to_string()),
            version: None,
        }
    }

    fn commit(version: u64) -> ObjectMeta {
        meta(&format!("{version:020}.json"))
    }

    fn names(answer: Option<Vec<ObjectMeta>>) -> Option<Vec<String>> {
        answer.map(|named| {
            named
                .into_iter()
                .map(|m| m.location.filename().unwrap_or_default().to_string())
                .collect()
        })
    }

    /// A log listed from version 5's file, naming 5 and 6, at `t0`.
    fn listed_5_and_6(t0: Instant) -> (Listings, Path, Path) {
        let mut listings = Listings::default();
        let log = Path::from(LOG);
        let offset = Path::from(format!("{LOG}/{:020}", 5));
        listings.listed(&log, Some(&offset), vec![commit(6), commit(5)], t0);
        (listings, log, offset)
    }

    #[test]
    fn the_listing_after_a_commit_is_the_one_before_plus_the_commit_once() {
        let t0 = Instant::now();
        let (mut listings, log, offset) = listed_5_and_6(t0);
        let t1 = t0 + Duration::from_millis(30);
        listings.putting(&commit(7).location, true);
        listings.committed(&commit(7), 7, t1);
        let at = t1 + Duration::from_millis(5);
        // from the same offset, and from a later one
        let answer = names(listings.answer(&log, Some(&offset), at));
        let expected = [5, 6, 7].map(|v| format!("{v:020}.json")).to_vec();
        assert_eq!(answer, Some(expected));
        assert_eq!(listings.answer(&log, Some(&offset), at), None);
        // the next statement's listing is made from the same offset
        let later = Path::from(format!("{LOG}/{:020}", 7));
        assert_eq!(listings.list_from(&log, &later), Some(Some(offset.clone())));

        let (mut listings, log, _) = listed_5_and_6(t0);
        listings.committed(&commit(7), 7, t1);
        let later = commit(6).location;
        let answer = names(listings.answer(&log, Some(&later), at));
        assert_eq!(answer, Some(vec![format!("{:020}.json", 7)]));
    }

    #[test]
    fn no_answer_unless_the_listing_named_the_version_before_the_commit() {
        let t0 = Instant::now();
        // another writer committed 7 after the listing; this process put 8
        let (mut listings, log, offset) = listed_5_and_6(t0);
        listings.committed(&commit(8), 8, t0);
        assert_eq!(listings.answer(&log, Some(&offset), t0), None);
        // a commit of a version the listing already named
        let (mut listings, log, offset) = listed_5_and_6(t0);
        listings.committed(&commit(6), 6, t0);
        assert_eq!(listings.answer(&log, Some(&offset), t0), None);
        // a listing naming no commit (nothing tells the latest version)
        let mut listings = Listings::default();
        let log = Path::from(LOG);
        listings.listed(&log, None, vec![meta("_last_checkpoint")], t0);
        listings.committed(&commit(0), 0, t0);
        listings.committed(&commit(1), 1, t0);
        assert_eq!(listings.answer(&log, None, t0), None);
        // no listing at all
        let mut listings = Listings::default();
        listings.committed(&commit(3), 3, t0);
        assert_eq!(listings.answer(&log, None, t0), None);
    }

    #[test]
    fn no_answer_for_an_earlier_offset_or_another_folder() {
        let t0 = Instant::now();
        let (mut listings, log, _) = listed_5_and_6(t0);
        listings.committed(&commit(7), 7, t0);
        let earlier = Path::from(format!("{LOG}/{:020}", 2));
        assert_eq!(listings.answer(&log, Some(&earlier), t0), None);
        assert_eq!(listings.answer(&log, None, t0), None);
        assert_eq!(listings.answer(&Path::from("u/_delta_log"), None, t0), None);
        // (still there for the listing it covers)
        let covered = Path::from(format!("{LOG}/{:020}", 6));
        assert!(listings.answer(&log, Some(&covered), t0).is_some());
    }

    #[test]
    fn stale_listings_and_late_listings_are_not_answered() {
        let t0 = Instant::now();
        let (mut listings, log, offset) = listed_5_and_6(t0);
        listings.committed(&commit(7), 7, t0 + FRESH + Duration::from_millis(1));
        assert_eq!(listings.answer(&log, Some(&offset), t0 + FRESH), None);

        let (mut listings, log, offset) = listed_5_and_6(t0);
        listings.committed(&commit(7), 7, t0);
        let late = t0 + FRESH + Duration::from_millis(1);
        assert_eq!(listings.answer(&log, Some(&offset), late), None);
    }

    #[test]
    fn other_writes_in_the_log_forget_it() {
        let t0 = Instant::now();
        // a checkpoint written between the listing and the commit
        let (mut listings, log, offset) = listed_5_and_6(t0);
        listings.putting(&meta("_last_checkpoint").location, false);
        listings.committed(&commit(7), 7, t0);
        assert_eq!(listings.answer(&log, Some(&offset), t0), None);
        // a failed put of the commit, a delete after it
        for change in [commit(7).location, commit(3).location] {
            let (mut listings, log, offset) = listed_5_and_6(t0);
            listings.committed(&commit(7), 7, t0);
            listings.changed(&change);
            assert_eq!(listings.answer(&log, Some(&offset), t0), None);
        }
        // the next commit's put forgets an answer not given
        let (mut listings, log, offset) = listed_5_and_6(t0);
        listings.committed(&commit(7), 7, t0);
        listings.putting(&commit(8).location, true);
        listings.committed(&commit(8), 8, t0);
        assert_eq!(listings.answer(&log, Some(&offset), t0), None);
        // writes elsewhere change nothing
        let (mut listings, log, offset) = listed_5_and_6(t0);
        listings.putting(&Path::from("t/part-0.parquet"), false);
        listings.changed(&Path::from("u/_delta_log/00000000000000000001.json"));
        listings.committed(&commit(7), 7, t0);
        assert!(listings.answer(&log, Some(&offset), t0).is_some());
    }

    #[test]
    fn a_listing_from_a_later_offset_is_made_from_the_known_one() {
        let t0 = Instant::now();
        let mut listings = Listings::default();
        let log = Path::from(LOG);
        let at = |v: u64| Path::from(format!("{LOG}/{v:020}"));
        assert_eq!(listings.list_from(&log, &at(5)), None);
        listings.listed(&log, Some(&at(1)), vec![commit(1), commit(2)], t0);
        assert_eq!(listings.list_from(&log, &at(2)), Some(Some(at(1))));
        assert_eq!(listings.list_from(&log, &at(1)), None);
        assert_eq!(listings.list_from(&log, &at(0)), None);
        listings.listed(&log, None, vec![commit(0)], t0);
        assert_eq!(listings.list_from(&log, &at(2)), Some(None));
    }

    #[test]
    fn only_log_folders_are_kept() {
        let t0 = Instant::now();
        let mut listings = Listings::default();
        let folder = Path::from("t/data");
        listings.listed(&folder, None, vec![meta("00000000000000000001.json")], t0);
        assert!(listings.logs.is_empty());
        assert!(Listings::is_log(&Path::from("a/b/_delta_log")));
        assert!(!Listings::is_log(&Path::from("a/_delta_log/x")));
        assert_eq!(commit_version(&commit(42).location), Some(42));
        for other in [
            "_last_checkpoint",
            "00000000000000000010.checkpoint.parquet",
            "7.json",
        ] {
            assert_eq!(commit_version(&meta(other).location), None, "{other}");
        }
    }
}
