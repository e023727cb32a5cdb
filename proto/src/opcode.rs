//! Operations.

use crate::ProtoError;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Opcode {
    Hello = 1,
    Ping = 2,
    Get = 3,
    Put = 4,
    Head = 5,
    Delete = 6,
    List = 7,
    BatchGet = 8,
    Prefetch = 9,
    Flush = 10,
    Stats = 11,
    /// Writes the origin refused for good: list them, or queue them for upload again.
    Uploads = 12,
    /// The order in which a reader will read keys: the node reads ahead of it.
    Plan = 13,
}

impl Opcode {
    pub const ALL: [Opcode; 13] = [
        Opcode::Hello,
        Opcode::Ping,
        Opcode::Get,
        Opcode::Put,
        Opcode::Head,
        Opcode::Delete,
        Opcode::List,
        Opcode::BatchGet,
        Opcode::Prefetch,
        Opcode::Flush,
        Opcode::Stats,
        Opcode::Uploads,
        Opcode::Plan,
    ];

    pub fn from_byte(byte: u8) -> Result<Opcode, ProtoError> {
        Opcode::ALL
            .into_iter()
            .find(|opcode| *opcode as u8 == byte)
            .ok_or(ProtoError::UnknownOpcode(byte))
    }
}
