-- Rate-limit windows shared by every process on this database (see app/src/core/ratelimit.rs).
-- One row per limited subject ("login:ada@example.com", "api:42"): when its window started, how
-- long it lasts, and how many hits processes have taken from it. Unlogged: a crash of
-- PostgreSQL resets the windows (allowing at most one extra window's worth), in exchange for
-- no WAL on a table written on every lease.
create unlogged table rate_limits (
    key text primary key,
    started timestamptz not null,
    window_secs integer not null check (window_secs > 0),
    taken bigint not null
);
