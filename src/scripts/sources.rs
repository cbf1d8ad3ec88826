//! The text of each script of the leased semaphore: its parts, in the order they run.
//! The tests build their scripts from this same file (`#[path]`), and
//! `scripts/server-instructions.sh` reads the part lists from it.
//!
//! Every script starts with `head.lua` (key names, the server's time). The hot-path
//! scripts then carry their fast parts (`fast.lua` and the fast operations they call)
//! and an entry part that returns when the fast path answers, before `common.lua` and
//! `ops.lua` (the full logic) are even set up; the others go straight to `common.lua`.

/// acquire: a grant, a "no" or a queued waiter.
pub(crate) const ACQUIRE: &str = concat!(
    include_str!("head.lua"),
    include_str!("fast.lua"),
    include_str!("fast_acquire.lua"),
    include_str!("acquire_entry.lua"),
    include_str!("common.lua"),
    include_str!("ops.lua"),
    include_str!("acquire.lua"),
);

/// release: frees the permits of a permit id.
pub(crate) const RELEASE: &str = concat!(
    include_str!("head.lua"),
    include_str!("fast.lua"),
    include_str!("fast_release.lua"),
    include_str!("release_entry.lua"),
    include_str!("common.lua"),
    include_str!("ops.lua"),
    include_str!("release.lua"),
);

/// batch: several tries and releases in one call.
pub(crate) const BATCH: &str = concat!(
    include_str!("head.lua"),
    include_str!("fast.lua"),
    include_str!("fast_acquire.lua"),
    include_str!("fast_release.lua"),
    include_str!("batch_entry.lua"),
    include_str!("common.lua"),
    include_str!("ops.lua"),
    include_str!("batch.lua"),
);

/// refresh: renews leases.
pub(crate) const REFRESH: &str = concat!(
    include_str!("head.lua"),
    include_str!("common.lua"),
    include_str!("refresh.lua"),
);

/// adopt: takes over a handed-over permit, checked against its record.
pub(crate) const ADOPT: &str = concat!(
    include_str!("head.lua"),
    include_str!("common.lua"),
    include_str!("adopt.lua"),
);

/// inspect: reads limit, permits in use and holders.
pub(crate) const INSPECT: &str = concat!(
    include_str!("head.lua"),
    include_str!("common.lua"),
    include_str!("inspect.lua"),
);

/// cancel: takes a waiter out of the queue.
pub(crate) const CANCEL: &str = concat!(
    include_str!("head.lua"),
    include_str!("common.lua"),
    include_str!("cancel.lua"),
);

/// set_limit: stores a limit for every client.
pub(crate) const SET_LIMIT: &str = concat!(
    include_str!("head.lua"),
    include_str!("common.lua"),
    include_str!("set_limit.lua"),
);
