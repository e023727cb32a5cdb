//! HELLO: version, limits, the token proof, and the shard map.

use super::*;

/// Answer a HELLO. Returns false when the connection must close (a wrong proof: no second
/// guess on the same connection).
pub(super) fn hello(connection: &Connection, header: &FrameHeader, extension: &[u8]) -> bool {
    let request = match HelloRequest::decode(extension) {
        Ok(request) => request,
        Err(error) => {
            connection.answer(
                header,
                Status::BadRequest,
                &[],
                error.to_string().as_bytes(),
            );
            return true;
        }
    };
    if !(request.version_min..=request.version_max).contains(&PROTOCOL_VERSION) {
        connection.answer(
            header,
            Status::Unsupported,
            &[],
            b"this server speaks protocol version 1",
        );
        return true;
    }
    let auth_required = match (&connection.policy.token, &request.proof) {
        (None, _) => false,
        (Some(_), None) => true,
        (Some(token), Some(proof)) => {
            if !hydrant_proto::auth::verify(
                token,
                &connection.server_nonce,
                &request.client_nonce,
                proof,
            ) {
                connection.answer(header, Status::Unauthenticated, &[], b"wrong token proof");
                return false;
            }
            false
        }
    };
    let limits = connection.policy.limits.negotiate(&request.limits);
    connection.limits.set(limits);
    connection.greeted.set(!auth_required);
    let response = HelloResponse {
        version: PROTOCOL_VERSION,
        limits,
        server_nonce: connection.server_nonce,
        auth_required,
        shard_count: connection.engine.shard_count() as u16,
        placement_hash: 1,
        shard_ports: connection.policy.shard_ports.to_vec(),
    };
    connection.answer(header, Status::Ok, &response.encode(), &[]);
    true
}
