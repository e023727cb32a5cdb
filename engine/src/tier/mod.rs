//! The DRAM tier in front of the NVMe store ([`dram::DramTier`]) and the admission of origin
//! data to NVMe ([`admission::NvmeAdmission`]).

pub mod admission;
pub mod dram;
