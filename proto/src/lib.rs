//! hydrant-proto: frames, opcodes and status codes of hydrant's wire protocol, with encode and
//! decode and no I/O. The protocol itself is specified and built in issue 3; this crate holds its
//! place in the workspace so that the dependency direction (server and client meet only here) is
//! fixed from the start.
