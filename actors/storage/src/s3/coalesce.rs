//! From queued element fetches to requests: the stage's dispatcher takes what is due, reads
//! a whole object per file element, and reads tar members due together whose byte ranges are
//! neighbours (at most [`COALESCE_GAP`] apart) with one ranged GET, each request under a
//! place among the requests in flight (`limit`).
//!
//! A Parquet row is no byte range known in advance: it is read on its own (`parquet`).
//!
//! With a disk tier, what it holds is read from it first (on the runtime's blocking threads,
//! a few elements per task; a miss there, a damaged or vanished object, goes back to the
//! queue for the store), and each element a request fetched is offered to it afterwards.

use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use tokio::sync::mpsc;

use super::limit::Outcome;
use super::remote::Remote;
use super::request::{Request, SourceInner};
use crate::tier::DiskTier;
use crate::{Location, MAX_MEMBER_LEN, StorageError};

/// Neighbouring tar members at most this many bytes apart are read with one request (the
/// gap is read and dropped: a few tar headers and `.cls` members).
pub const COALESCE_GAP: u64 = 64 << 10;

/// A coalesced request covers at most this many bytes.
const MAX_COALESCED: u64 = 16 << 20;

/// Requests taken from the queue at once (and grouped into neighbours).
const MAX_DUE: usize = 256;

/// Elements read from the disk tier by one blocking task.
const TIER_READS_PER_TASK: usize = 8;

/// Where an element's bytes are: a whole object, or a range of a shard.
enum Due {
    Object(String),
    Member {
        shard: u32,
        range: Range<u64>,
    },
    /// A Parquet row or an array row, read by the local source's reader through ranged
    /// GETs.
    Row,
}

fn due(source: &SourceInner, element: u32) -> Result<Due, StorageError> {
    let index = &source.index;
    match index.location(element) {
        Some(Location::File(key)) => Ok(Due::Object(key.to_string_lossy().into_owned())),
        Some(Location::TarMember { shard, offset, len }) if len <= MAX_MEMBER_LEN => {
            Ok(Due::Member {
                shard,
                range: offset..offset + len,
            })
        }
        Some(Location::TarMember { .. }) => Err(StorageError::Remote {
            url: source.dataset.url.to_string(),
            code: "refused",
            message: format!("element {element} is larger than a member may be"),
        }),
        // An array row's values are ranges of several objects, read together.
        Some(Location::ParquetRow { .. } | Location::ArrayRow { .. }) => Ok(Due::Row),
        None => Err(StorageError::NoSuchItem {
            id: element,
            len: index.len(),
        }),
    }
}

/// Takes what is due, groups neighbouring tar members, and runs each group under a place
/// among the requests in flight.
pub(super) async fn dispatch(
    mut rx: mpsc::UnboundedReceiver<Request>,
    remote: Arc<Remote>,
    requeue: mpsc::UnboundedSender<Request>,
) {
    while let Some(first) = rx.recv().await {
        let mut due_now = vec![first];
        while due_now.len() < MAX_DUE {
            match rx.try_recv() {
                Ok(r) => due_now.push(r),
                Err(_) => break,
            }
        }
        if let Some(tier) = &remote.tier {
            due_now = from_tier(tier, due_now, &requeue);
        }
        let (groups, rows) = groups(due_now);
        for r in rows {
            super::parquet::spawn_read(&remote, r);
        }
        for group in groups {
            let place = remote.limit.acquire().await;
            let now = std::time::Instant::now();
            for (r, _) in &group.members {
                remote.stats.queued(now.duration_since(r.queued_at));
            }
            remote.stats.in_flight.fetch_add(1, Relaxed);
            let remote = remote.clone();
            tokio::spawn(async move {
                let outcome = run(&remote, group).await;
                remote.stats.in_flight.fetch_sub(1, Relaxed);
                place.release(outcome);
                remote
                    .stats
                    .limit
                    .store(remote.limit.limit() as u64, Relaxed);
            });
        }
    }
}

/// Starts reading from the tier the requests whose element it holds; returns the others.
fn from_tier(
    tier: &Arc<DiskTier>,
    due_now: Vec<Request>,
    requeue: &mpsc::UnboundedSender<Request>,
) -> Vec<Request> {
    let mut rest = Vec::with_capacity(due_now.len());
    let mut held = Vec::new();
    for r in due_now {
        if r.tier_checked {
            rest.push(r);
            continue;
        }
        match r.source.tier_key(r.element) {
            Some(key) if tier.lookup(&key) => held.push((r, key)),
            _ => rest.push(r),
        }
    }
    while !held.is_empty() {
        let chunk: Vec<_> = held.drain(..held.len().min(TIER_READS_PER_TASK)).collect();
        let (tier, requeue) = (tier.clone(), requeue.clone());
        tokio::task::spawn_blocking(move || {
            for (mut r, key) in chunk {
                let owner = r.source.owner(r.element);
                match tier.read(&key, Some(owner)) {
                    Some(bytes) => (r.done)(Ok(bytes), 0),
                    None => {
                        r.tier_checked = true;
                        if let Err(mpsc::error::SendError(r)) = requeue.send(r) {
                            (r.done)(
                                Err(StorageError::Remote {
                                    url: r.source.dataset.url.to_string(),
                                    code: "unavailable",
                                    message: "the fetch stage is shut down".into(),
                                }),
                                0,
                            );
                        }
                    }
                }
            }
        });
    }
    rest
}

/// One request's worth of elements: a whole object, or one range of a shard that covers
/// every member in it.
struct Group {
    source: Arc<SourceInner>,
    key: Result<String, StorageError>,
    range: Option<Range<u64>>,
    /// Each element's request and its range within the group's bytes.
    members: Vec<(Request, Option<Range<usize>>)>,
}

/// The requests' groups, and the Parquet rows (each read on its own).
fn groups(requests: Vec<Request>) -> (Vec<Group>, Vec<Request>) {
    let mut out = Vec::new();
    let mut rows = Vec::new();
    // (source, shard, range, request) of tar members, to be coalesced.
    let mut members = Vec::new();
    for r in requests {
        match due(&r.source, r.element) {
            Ok(Due::Object(key)) => out.push(Group {
                source: r.source.clone(),
                key: Ok(key),
                range: None,
                members: vec![(r, None)],
            }),
            Ok(Due::Member { shard, range }) => members.push((shard, range, r)),
            Ok(Due::Row) => rows.push(r),
            Err(e) => (r.done)(Err(e), 0),
        }
    }
    members.sort_by_key(|(shard, range, r)| (Arc::as_ptr(&r.source) as usize, *shard, range.start));
    for (shard, range, r) in members {
        let joins = out.last().is_some_and(|g: &Group| {
            let Some(span) = &g.range else { return false };
            Arc::ptr_eq(&g.source, &r.source)
                && g.members.first().and_then(|(m, _)| shard_of(m)) == Some(shard)
                && range.start >= span.start
                && range.start <= span.end + COALESCE_GAP
                && range.end.max(span.end) - span.start <= MAX_COALESCED
        });
        if joins {
            let g = out.last_mut().expect("checked above");
            let span = g.range.as_mut().expect("checked above");
            span.end = span.end.max(range.end);
            g.members.push((r, Some(offset_range(&range))));
        } else {
            let key = r
                .source
                .index
                .shards()
                .get(shard as usize)
                .map(|p| p.to_string_lossy().into_owned())
                .ok_or(StorageError::NoSuchItem {
                    id: r.element,
                    len: r.source.index.len(),
                });
            out.push(Group {
                source: r.source.clone(),
                key,
                range: Some(range.clone()),
                members: vec![(r, Some(offset_range(&range)))],
            });
        }
    }
    // Member ranges are absolute until here; make them relative to their group's start.
    for g in &mut out {
        if let Some(span) = &g.range {
            let base = span.start as usize;
            for (_, r) in &mut g.members {
                if let Some(r) = r {
                    *r = r.start - base..r.end - base;
                }
            }
        }
    }
    (out, rows)
}

fn shard_of(r: &Request) -> Option<u32> {
    match r.source.index.location(r.element)? {
        Location::TarMember { shard, .. } => Some(shard),
        Location::File(_) | Location::ParquetRow { .. } | Location::ArrayRow { .. } => None,
    }
}

fn offset_range(r: &Range<u64>) -> Range<usize> {
    r.start as usize..r.end as usize
}

/// Runs one group's request and hands each member its bytes: whether the store answered.
async fn run(remote: &Remote, group: Group) -> Outcome {
    let Group {
        source,
        key,
        range,
        members,
    } = group;
    let key = match key {
        Ok(k) => k,
        Err(e) => {
            fail_all(members, &e);
            return Outcome::Other;
        }
    };
    if members.len() > 1 {
        remote.stats.coalesced.fetch_add(1, Relaxed);
    }
    // Every read asks for the ETag the index holds (and compares the answer's): an object
    // rewritten in place since indexing is an element error, never other bytes.
    let if_match = source.etag(&key);
    let asked = std::time::Instant::now();
    match remote.get(&source.dataset, &key, range, if_match).await {
        Ok(bytes) => {
            let took = asked.elapsed();
            for (r, part) in members {
                let piece = match part {
                    Some(p) => bytes.slice(p),
                    None => bytes.clone(),
                };
                if let Some(tier) = &remote.tier
                    && let Some(key) = source.tier_key(r.element)
                {
                    tier.offer(key, piece.clone(), Some(source.owner(r.element)));
                }
                let len = piece.len() as u64;
                (r.done)(Ok(piece.to_vec()), len);
            }
            Outcome::Served(took)
        }
        Err(e) => {
            fail_all(members, &e);
            Outcome::Other
        }
    }
}

/// Tells each element of a failed group why.
fn fail_all(members: Vec<(Request, Option<Range<usize>>)>, e: &StorageError) {
    for (r, _) in members {
        (r.done)(Err(clone_error(e)), 0);
    }
}

/// A copy of a fetch error for each element of a failed group.
fn clone_error(e: &StorageError) -> StorageError {
    match e {
        StorageError::Remote { url, code, message } => StorageError::Remote {
            url: url.clone(),
            code,
            message: message.clone(),
        },
        other => StorageError::Remote {
            url: String::new(),
            code: "refused",
            message: other.to_string(),
        },
    }
}
