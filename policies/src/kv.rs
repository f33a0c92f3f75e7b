//! What an engine tells the outside world about its prefix cache.
//!
//! vLLM's KV event publisher (and the engines that copy it) announces every block it stores and
//! every block it evicts; Dynamo's KV router and llm-d's precise prefix scorer mirror those
//! announcements to know exactly which worker holds which prefix. A host that receives such
//! events (the simulator, from its engine model) hands them to [`crate::Router::apply_kv_events`].

/// One change to an engine's prefix cache. Block hashes are the same prefix-block chain hashes
/// as [`crate::RouteRequest::prefix`]: hash `i` identifies the whole prompt prefix up to and
/// including block `i`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum KvEvent {
    /// The engine computed a block and keeps it reusable.
    Stored {
        /// The block's chain hash.
        block: u64,
        /// The chain hash of the block before it (`None` for a prompt's first block).
        parent: Option<u64>,
    },
    /// The engine evicted a block.
    Removed {
        /// The block's chain hash.
        block: u64,
    },
    /// The engine dropped its whole cache (restart, crash, reset).
    AllCleared,
}

impl KvEvent {
    /// The events an engine publishes when it stores a whole chain of blocks, first to last:
    /// each block `Stored` with the one before it as its parent.
    pub fn stored_chain(chain: &[u64]) -> impl Iterator<Item = KvEvent> + '_ {
        chain.iter().enumerate().map(|(i, &block)| KvEvent::Stored {
            block,
            parent: i.checked_sub(1).map(|p| chain[p]),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stored_chain_links_each_block_to_the_one_before() {
        let events: Vec<KvEvent> = KvEvent::stored_chain(&[7, 8, 9]).collect();
        assert_eq!(
            events,
            [
                KvEvent::Stored {
                    block: 7,
                    parent: None
                },
                KvEvent::Stored {
                    block: 8,
                    parent: Some(7)
                },
                KvEvent::Stored {
                    block: 9,
                    parent: Some(8)
                },
            ]
        );
    }
}
