//! hydrant-client: routing, pipelining and pinned reads, and the `hydrant` CLI. Built in issue 3.
