//! The ROUTER messages of one poll, held in libzmq's own message buffers.
//!
//! Copying every frame into a fresh `Vec` (and every message into a `Vec` of them) cost
//! three allocations and two copies per message before the registry saw it. Here each
//! frame is received into a `zmq::Message` kept in one reused `Vec`, and the registry reads
//! the frames where libzmq put them (`ConnectionRegistry::poll_frames`). The messages are
//! closed as soon as the poll is over, so libzmq can reuse its receive buffers.
//!
//! Each message also keeps its connection's `Peer-Address` (the registry's peer check
//! needs it). Consecutive messages mostly come from one connection, so an address is
//! stored once per run of equal addresses, not once per message.

/// libzmq's message property holding the source address of the message's connection.
const PEER_ADDRESS: &str = "Peer-Address";

/// One poll's ROUTER messages: their frames back to back, and where each message ends.
#[derive(Default)]
pub(crate) struct RouterBatch {
    frames: Vec<zmq::Message>,
    ends: Vec<usize>,
    /// Per message: its index in `addresses`, `None` if libzmq reported none.
    sources: Vec<Option<usize>>,
    /// Distinct consecutive source addresses of this poll.
    addresses: Vec<String>,
}

impl RouterBatch {
    /// Receives whole messages off `socket` without blocking until it has none left.
    /// `Ok` once it reports `EAGAIN`; another error ends the drain with the messages read
    /// so far kept (a partly read message is discarded). The frames of a message arrive
    /// together, so only a message's first frame can find nothing; "more" is read off each
    /// frame, sparing a `getsockopt` per frame.
    pub fn drain(&mut self, socket: &zmq::Socket) -> zmq::Result<()> {
        loop {
            let start = self.frames.len();
            loop {
                self.frames.push(zmq::Message::new());
                let last = self.frames.len() - 1;
                if let Err(e) = socket.recv(&mut self.frames[last], zmq::DONTWAIT) {
                    self.frames.truncate(start);
                    return match e {
                        zmq::Error::EAGAIN => Ok(()),
                        other => Err(other),
                    };
                }
                if !self.frames[last].get_more() {
                    break;
                }
            }
            let last = self.frames.len() - 1;
            let source = match self.frames[last].gets(PEER_ADDRESS) {
                Some(address) if self.addresses.last().is_some_and(|a| a == address) => Some(self.addresses.len() - 1),
                Some(address) => {
                    self.addresses.push(address.to_string());
                    Some(self.addresses.len() - 1)
                }
                None => None,
            };
            self.sources.push(source);
            self.ends.push(self.frames.len());
        }
    }

    /// The messages in arrival order, each as its frames with its connection's source
    /// address.
    pub fn messages(&self) -> impl Iterator<Item = (&[zmq::Message], Option<&str>)> + '_ {
        let starts = std::iter::once(0).chain(self.ends.iter().copied());
        let sources = self.sources.iter().map(|s| s.and_then(|i| self.addresses.get(i)).map(String::as_str));
        starts.zip(self.ends.iter().copied()).map(|(start, end)| &self.frames[start..end]).zip(sources)
    }

    /// Closes every message, keeping the capacity for the next poll.
    pub fn clear(&mut self) {
        self.frames.clear();
        self.ends.clear();
        self.sources.clear();
        self.addresses.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_keep_their_frames_and_order() {
        let ctx = zmq::Context::new();
        let router = ctx.socket(zmq::ROUTER).expect("router");
        router.bind("inproc://router-batch").expect("bind");
        let dealer = ctx.socket(zmq::DEALER).expect("dealer");
        dealer.set_identity(b"d1").expect("identity");
        dealer.connect("inproc://router-batch").expect("connect");
        dealer.send("one", 0).expect("send");
        dealer.send_multipart(["two", "parts"], 0).expect("send");
        // inproc delivery is synchronous once connected, but the ROUTER learns the peer
        // through a command: poll until the first message is readable.
        assert_eq!(router.poll(zmq::POLLIN, 5_000).expect("poll"), 1);
        let mut batch = RouterBatch::default();
        let mut got: Vec<Vec<Vec<u8>>> = Vec::new();
        for _ in 0..100 {
            batch.drain(&router).expect("drain");
            got.extend(batch.messages().map(|(m, source)| {
                assert_eq!(source, None, "inproc connections have no source address");
                m.iter().map(|f| f.to_vec()).collect()
            }));
            batch.clear();
            if got.len() == 2 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let want: Vec<Vec<Vec<u8>>> =
            vec![vec![b"d1".to_vec(), b"one".to_vec()], vec![b"d1".to_vec(), b"two".to_vec(), b"parts".to_vec()]];
        assert_eq!(got, want);
        batch.drain(&router).expect("drain");
        assert_eq!(batch.messages().count(), 0);
    }
}
