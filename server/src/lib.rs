//! hydrant-server: per-shard listeners, connections and dispatch onto the engine. Built in issue 3;
//! until then the engine is used in process (see `hydrant-engine`) and through `hydrant-bench`.
