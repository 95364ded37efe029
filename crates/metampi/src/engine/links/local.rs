//! The local backend: a message a rank sends to itself is queued in memory
//! and handed to the matching engine in the next progress pass.

use super::super::core::Core;
use super::Links;
use crate::envelope::Envelope;

impl Links {
    /// Queues a message to this rank itself; a standard-mode send is complete
    /// at once (its bytes are copied), a synchronous one when it is matched.
    pub(super) fn post_local(&mut self, core: &mut Core, env: Envelope, sync: bool) {
        let id = env.sreq;
        let data = core.send_bytes(id).map(<[u8]>::to_vec).unwrap_or_default();
        self.self_q.push_back((env, data));
        if !sync {
            core.complete_send(id);
        }
    }

    /// Hands what this rank sent itself to the matching engine; returns
    /// whether there was any.
    pub(super) fn drain_self(&mut self, core: &mut Core) -> bool {
        let mut moved = false;
        while let Some((env, data)) = self.self_q.pop_front() {
            core.handle_incoming(&env, &data);
            moved = true;
        }
        moved
    }
}
