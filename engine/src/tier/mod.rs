//! The tiers in front of the NVMe store. Today: the DRAM tier ([`dram::DramTier`]).

pub mod dram;
