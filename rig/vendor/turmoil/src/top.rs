use crate::envelope::{Envelope, Protocol};
use crate::host::Host;
use crate::{config, TRACING_TARGET};

use crate::Map;
use rand::{Rng, RngCore};
use rand_distr::{Distribution, Exp};
use std::collections::VecDeque;
use std::io::{Error, ErrorKind, Result};
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;
use tokio::time::Instant;

/// Describes the network topology.
pub(crate) struct Topology {
    config: config::Link,

    /// Specific configuration overrides between specific hosts.
    links: Map<Pair, Link>,

    /// The network's clock. Rig patch: upstream keeps a runtime with no
    /// software and ticks it every step, only to read its paused clock; that
    /// clock advances by exactly each tick, so the sum is kept instead. It is
    /// also every link's clock (upstream gave each link a copy, set on every
    /// step), so a link with nothing on its way is not visited at all.
    now: Instant,

    /// Rig patch: how many messages, over all links, are ready for their
    /// host (the sum of every link's `ready`), so that the hosts of a step
    /// with none skip looking through every link.
    ready: usize,

    /// Rig patch: how many of those are ready for each host, by the host's
    /// place among the world's hosts (the order they were added in, which is
    /// also their runtimes' place in the simulation), so that a host with
    /// none skips its links while others have some, without a lookup by
    /// address.
    ready_for: Vec<usize>,

    /// Rig patch: for each host, by its place, the links it is an end of (by
    /// their place in `links`, in that order) and which end it is: a
    /// delivery visits only those, in the order upstream's walk over every
    /// link with an address compare met them.
    ends_of: Vec<Vec<(usize, usize)>>,

    /// Rig patch: the places of the links with something on their way (each
    /// link's `busy` says whether it is listed). The network's tick visits
    /// these alone; a link leaves the list on the first tick that finds its
    /// queue empty. (No draw and nothing shared depends on the order links
    /// are ticked in: each moves its own due messages.)
    busy: Vec<usize>,
}

/// This type is used as the key in the [`Topology::links`] map. See [`new`]
/// which orders the addrs, such that this type uniquely identifies the link
/// between two hosts on the network.
#[derive(Debug, Clone, Eq, PartialEq)]
struct Pair(IpAddr, IpAddr);

/// Rig patch: two IPv4 addresses are hashed as one word, where the derived
/// hash wrote each address's discriminant and bits apart (a link is looked up
/// by its pair for every segment sent). Equal pairs hash equal as before; the
/// map of links keeps its order of insertion whatever the hash.
impl std::hash::Hash for Pair {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        match (self.0, self.1) {
            (IpAddr::V4(a), IpAddr::V4(b)) => state.write_u64(u64::from(a.to_bits()) << 32 | u64::from(b.to_bits())),
            (a, b) => {
                a.hash(state);
                b.hash(state);
            }
        }
    }
}

impl Pair {
    fn new(a: IpAddr, b: IpAddr) -> Pair {
        assert_ne!(a, b);

        if a < b {
            Pair(a, b)
        } else {
            Pair(b, a)
        }
    }
}

/// An iterator for the network topology, providing access to all active links
/// in the simulated network.
pub struct LinksIter<'a> {
    iter: indexmap::map::IterMut<'a, Pair, Link>,
    /// The network's time, every link's (rig patch: links keep no copy).
    now: Instant,
}

/// An iterator for the link, providing access to sent messages that have not
/// yet been delivered.
pub struct LinkIter<'a> {
    a: IpAddr,
    b: IpAddr,
    now: Instant,
    iter: std::collections::vec_deque::IterMut<'a, Sent>,
}

impl LinkIter<'_> {
    /// The [`IpAddr`] pair for the link. Always ordered to uniquely identify
    /// the link.
    pub fn pair(&self) -> (IpAddr, IpAddr) {
        (self.a, self.b)
    }

    /// Schedule all messages on the link for delivery the next time the
    /// simulation steps, consuming the iterator.
    pub fn deliver_all(self) {
        for sent in self {
            sent.deliver();
        }
    }
}

/// Provides a reference to a message that is currently inflight on the network
/// from one host to another.
pub struct SentRef<'a> {
    src: SocketAddr,
    dst: SocketAddr,
    now: Instant,
    sent: &'a mut Sent,
}

impl SentRef<'_> {
    /// The (src, dst) [`SocketAddr`] pair for the message.
    pub fn pair(&self) -> (SocketAddr, SocketAddr) {
        (self.src, self.dst)
    }

    /// The message [`Protocol`].
    pub fn protocol(&self) -> &Protocol {
        &self.sent.protocol
    }

    /// Schedule the message for delivery the next time the simulation steps,
    /// consuming the item.
    pub fn deliver(self) {
        self.sent.deliver(self.now);
    }
}

impl<'a> Iterator for LinksIter<'a> {
    type Item = LinkIter<'a>;

    fn next(&mut self) -> Option<Self::Item> {
        let (pair, link) = self.iter.next()?;

        Some(LinkIter { a: pair.0, b: pair.1, now: self.now, iter: link.sent.iter_mut() })
    }
}

impl<'a> Iterator for LinkIter<'a> {
    type Item = SentRef<'a>;

    fn next(&mut self) -> Option<Self::Item> {
        let sent = self.iter.next()?;

        Some(SentRef { src: sent.src, dst: sent.dst, now: self.now, sent })
    }

    // Rig patch: a link's messages are counted on every quiet step (whether
    // anything is in flight); the queue knows its length.
    fn size_hint(&self) -> (usize, Option<usize>) {
        self.iter.size_hint()
    }

    fn count(self) -> usize {
        self.iter.len()
    }
}

impl ExactSizeIterator for LinkIter<'_> {}

/// A two-way link between two hosts on the network.
struct Link {
    /// The state of the link from node 'a' to node 'b'.
    /// Of the two nodes attached to a link, 'a' is the
    /// one whose ip address sorts smallest.
    state_a_b: State,
    /// The state of the link from node 'b' to node 'a'.
    /// Of the two nodes attached to a link, 'b' is the
    /// one whose ip address sorts greatest.
    state_b_a: State,

    /// Optional, per-link configuration.
    config: config::Link,

    /// Sent messages that are either scheduled for delivery in the future
    /// or are on hold.
    sent: VecDeque<Sent>,

    /// Messages that are ready to be delivered. Rig patch: one queue for each
    /// end (the host whose address sorts smallest, then the other) rather than
    /// a map keyed by the destination's address: a message on a link is for one
    /// of its two ends, and is filed there without hashing the address.
    deliverable: [VecDeque<Envelope>; 2],

    /// Rig patch: how many messages `deliverable` holds for each end.
    ready: [usize; 2],

    /// Rig patch: the places of its two ends among the world's hosts, in the
    /// same order, for the topology's counts by host.
    places: [usize; 2],

    /// Rig patch: whether the link is in the topology's list of busy links.
    busy: bool,
    // Rig patch: upstream's `now`, the network's time copied into every link on
    // every step, is gone: the topology passes its own clock in.
}

/// States that a link between two nodes can be in.
#[derive(Clone, Copy)]
enum State {
    /// The link is healthy.
    Healthy,

    /// The link was explicitly partitioned.
    ExplicitPartition,

    /// The link was randomly partitioned.
    RandPartition,

    /// Messages are being held indefinitely.
    Hold,
}

impl Topology {
    pub(crate) fn new(config: config::Link) -> Topology {
        // Rig patch: the network's clock is only ever compared with itself
        // (its links' times are all taken from it), so any instant will do
        // to start from; upstream built a whole runtime for each simulation
        // to read its paused clock.
        Topology {
            config,
            links: Map::default(),
            now: Instant::now(),
            ready: 0,
            ready_for: Vec::new(),
            ends_of: Vec::new(),
            busy: Vec::new(),
        }
    }

    /// Rig patch: makes room for the counts and the links of the host at
    /// `place` among the world's hosts (called as each is added, before its
    /// links are registered).
    pub(crate) fn add_host(&mut self, place: usize) {
        if self.ready_for.len() <= place {
            self.ready_for.resize(place + 1, 0);
            self.ends_of.resize_with(place + 1, Vec::new);
        }
    }

    /// Register a link between two hosts (rig patch: with their places among
    /// the world's hosts).
    pub(crate) fn register(&mut self, a: IpAddr, a_place: usize, b: IpAddr, b_place: usize) {
        let pair = Pair::new(a, b);
        // The ends in the pair's order: the address that sorts smallest first.
        let places = if pair.0 == a { [a_place, b_place] } else { [b_place, a_place] };
        let (link_place, fresh) = self.links.insert_full(pair, Link::new(places));
        assert!(fresh.is_none());
        for (end, place) in places.into_iter().enumerate() {
            self.add_host(place);
            self.ends_of[place].push((link_place, end));
        }
    }

    pub(crate) fn set_max_message_latency(&mut self, value: Duration) {
        self.config.latency_mut().max_message_latency = value;
    }

    pub(crate) fn set_link_message_latency(&mut self, a: IpAddr, b: IpAddr, value: Duration) {
        let pair = Pair::new(a, b);
        let latency = self
            .links
            .get_mut(&pair)
            .unwrap_or_else(|| panic!("unable to find link between {pair:?}"))
            .latency(self.config.latency());
        latency.min_message_latency = value;
        latency.max_message_latency = value;
    }

    pub(crate) fn set_link_max_message_latency(&mut self, a: IpAddr, b: IpAddr, value: Duration) {
        let pair = Pair::new(a, b);
        self.links
            .get_mut(&pair)
            .unwrap_or_else(|| panic!("unable to find link between {pair:?}"))
            .latency(self.config.latency())
            .max_message_latency = value;
    }

    pub(crate) fn set_message_latency_curve(&mut self, value: f64) {
        self.config.latency_mut().latency_distribution = Exp::new(value).unwrap();
    }

    pub(crate) fn set_fail_rate(&mut self, value: f64) {
        self.config.message_loss_mut().fail_rate = value;
    }

    pub(crate) fn set_link_fail_rate(&mut self, a: IpAddr, b: IpAddr, value: f64) {
        let pair = Pair::new(a, b);
        self.links
            .get_mut(&pair)
            .unwrap_or_else(|| panic!("unable to find link between {pair:?}"))
            .message_loss(self.config.message_loss())
            .fail_rate = value;
    }

    // Send a `message` from `src` to `dst`. This method returns immediately,
    // and message delivery happens at a later time (or never, if the link is
    // broken).
    pub(crate) fn enqueue_message(
        &mut self,
        rand: &mut dyn RngCore,
        src: SocketAddr,
        dst: SocketAddr,
        message: Protocol,
    ) -> Result<()> {
        let pair = Pair::new(src.ip(), dst.ip());
        if let Some((place, _, link)) = self.links.get_full_mut(&pair) {
            let before = link.ready;
            // The end the message is for: the second is the address that sorts greatest.
            let to = usize::from(dst.ip() == pair.1);
            let result = link.enqueue_message(&self.config, rand, src, dst, message, to, self.now);
            if before != link.ready {
                count_ready(&mut self.ready, &mut self.ready_for, link.places, before, link.ready);
            }
            link.list_if_busy(&mut self.busy, place);
            result
        } else {
            Err(Error::new(ErrorKind::ConnectionRefused, "Connection refused"))
        }
    }

    /// Rig patch: whether any link has a message ready for the host at
    /// `place` among the world's hosts; with none,
    /// [`Topology::deliver_messages`] would do nothing (and the caller need
    /// not find the host).
    pub(crate) fn has_ready_for(&self, place: usize) -> bool {
        self.ready != 0 && self.ready_for.get(place).is_some_and(|ready| *ready != 0)
    }

    // Move messages from any network links to the `dst` host (rig patch: which
    // is the host at `place` among the world's hosts).
    pub(crate) fn deliver_messages(&mut self, rand: &mut dyn RngCore, dst: &mut Host, place: usize) {
        // Rig patch: no link has anything for this host, so none would do anything.
        if !self.has_ready_for(place) {
            return;
        }
        // Rig patch: the host's own links, in the order of all links (upstream
        // walked every link and compared both ends' addresses with the host's).
        let Topology { config, links, now, ready, ready_for, ends_of, busy } = self;
        for &(link_place, end) in &ends_of[place] {
            let (_, link) = links.get_index_mut(link_place).expect("a link's place");
            let before = link.ready;
            link.deliver_messages(config, rand, dst, end, *now);
            if before != link.ready {
                count_ready(ready, ready_for, link.places, before, link.ready);
            }
            // A delivery that is refused sends a reset back over the link.
            link.list_if_busy(busy, link_place);
        }
    }

    pub(crate) fn hold(&mut self, a: IpAddr, b: IpAddr) {
        self.get_link_mut(&Pair::new(a, b)).hold();
    }

    pub(crate) fn release(&mut self, a: IpAddr, b: IpAddr) {
        let now = self.now;
        self.get_link_mut(&Pair::new(a, b)).release(now);
    }

    pub(crate) fn partition(&mut self, a: IpAddr, b: IpAddr) {
        self.get_link_mut(&Pair::new(a, b)).explicit_partition();
    }

    pub(crate) fn partition_oneway(&mut self, a: IpAddr, b: IpAddr) {
        let link = &mut self.get_link_mut(&Pair::new(a, b));
        link.partition_oneway(a, b);
    }

    pub(crate) fn repair(&mut self, a: IpAddr, b: IpAddr) {
        self.get_link_mut(&Pair::new(a, b)).explicit_repair();
    }

    pub(crate) fn repair_oneway(&mut self, a: IpAddr, b: IpAddr) {
        let link = &mut self.get_link_mut(&Pair::new(a, b));
        link.repair_oneway(a, b);
    }

    pub(crate) fn tick_by(&mut self, duration: Duration) {
        self.now += duration;
        // Rig patch: only the links with something on their way are visited
        // (upstream called every link on every step to set its time and look at
        // its queue, which is empty on most links on most steps); a link whose
        // queue is empty after its tick leaves the list.
        let Topology { links, now, ready, ready_for, busy, .. } = self;
        busy.retain(|&link_place| {
            let (_, link) = links.get_index_mut(link_place).expect("a link's place");
            let before = link.ready;
            link.process_deliverables(*now);
            if before != link.ready {
                count_ready(ready, ready_for, link.places, before, link.ready);
            }
            link.busy = !link.sent.is_empty();
            link.busy
        });
    }

    /// Rig patch: how many messages are on their way over the links whose
    /// pair `counted` accepts: [`LinkIter::count`] summed, without an
    /// iterator made for every link (asked after most steps).
    pub(crate) fn on_the_way(&self, mut counted: impl FnMut((IpAddr, IpAddr)) -> bool) -> usize {
        self.links.iter().filter(|(pair, _)| counted((pair.0, pair.1))).map(|(_, link)| link.sent.len()).sum()
    }

    pub(crate) fn iter_mut(&mut self) -> LinksIter<'_> {
        LinksIter { iter: self.links.iter_mut(), now: self.now }
    }

    #[inline]
    fn get_link_mut(&mut self, pair: &Pair) -> &mut Link {
        self.links.get_mut(pair).unwrap_or_else(|| panic!("unable to find link between {pair:?}"))
    }
}

/// Rig patch: moves the counts of ready messages, in all and per host, by
/// what a link's counts moved (`before` to `after`, per end; the ends' hosts
/// are at `places`). (Called only when they moved: on most steps no link's
/// count does.)
fn count_ready(ready: &mut usize, ready_for: &mut [usize], places: [usize; 2], before: [usize; 2], after: [usize; 2]) {
    for end in 0..2 {
        if before[end] != after[end] {
            let count = &mut ready_for[places[end]];
            *count = *count + after[end] - before[end];
        }
    }
    *ready = *ready + after[0] + after[1] - before[0] - before[1];
}

/// Represents a message sent between two hosts on the network.
struct Sent {
    src: SocketAddr,
    dst: SocketAddr,
    status: DeliveryStatus,
    protocol: Protocol,
    /// Rig patch: the end of the link the message is for (0 for the host whose
    /// address sorts smallest), decided once when it is sent rather than by
    /// comparing the addresses again when it is due.
    to: usize,
}

impl Sent {
    fn deliver(&mut self, now: Instant) {
        self.status = DeliveryStatus::DeliverAfter(now);
    }
}

enum DeliveryStatus {
    DeliverAfter(Instant),
    Hold,
}

impl Link {
    fn new(places: [usize; 2]) -> Link {
        Link {
            state_a_b: State::Healthy,
            state_b_a: State::Healthy,
            config: config::Link::default(),
            sent: VecDeque::new(),
            deliverable: [VecDeque::new(), VecDeque::new()],
            ready: [0, 0],
            places,
            busy: false,
        }
    }

    /// Rig patch: puts the link, at `place` among the links, in the list of
    /// those with something on their way if it has something and is not there.
    fn list_if_busy(&mut self, busy: &mut Vec<usize>, place: usize) {
        if !self.busy && !self.sent.is_empty() {
            self.busy = true;
            busy.push(place);
        }
    }

    // Rig patch: `to` is the end the message is for (see `Sent::to`), `now`
    // the network's time.
    #[allow(clippy::too_many_arguments)]
    fn enqueue_message(
        &mut self,
        global_config: &config::Link,
        rand: &mut dyn RngCore,
        src: SocketAddr,
        dst: SocketAddr,
        message: Protocol,
        to: usize,
        now: Instant,
    ) -> Result<()> {
        tracing::trace!(target: TRACING_TARGET, ?src, ?dst, protocol = %message, "Send");

        self.rand_partition_or_repair(global_config, rand, now);
        let result = self.enqueue(global_config, rand, src, dst, message, to, now);
        self.process_deliverables(now);
        result
    }

    fn get_state_for_message(&self, to: usize) -> State {
        // Between each pair of ip-addresses there can exist a link.
        // A link between two such pairs can be constructed as
        // Pair::new(x,y) or Pair::new(y,x). These two expressions create
        // the exact same link. We denote one of the ends of the link as 'a',
        // and the other 'b'. 'a' is always the one that compares smaller, i.e,
        // `a < b` holds. Rig patch: a message for 'b' goes from 'a' to 'b'
        // (upstream compared the two addresses again).
        if to == 1 {
            self.state_a_b
        } else {
            self.state_b_a
        }
    }

    // src -> link -> dst
    //        ^-- you are here!
    //
    // Messages may be dropped, sit on the link for a while (due to latency, or
    // because the link has stalled), or be delivered immediately.
    // Link will return an Err(()) if the socket buffer is full.
    #[allow(clippy::too_many_arguments)]
    fn enqueue(
        &mut self,
        global_config: &config::Link,
        rand: &mut dyn RngCore,
        src: SocketAddr,
        dst: SocketAddr,
        message: Protocol,
        to: usize,
        now: Instant,
    ) -> Result<()> {
        let state = self.get_state_for_message(to);
        let status = match state {
            State::Healthy => {
                let delay = self.delay(global_config.latency(), rand);
                DeliveryStatus::DeliverAfter(now + delay)
            }
            // Only A->B is blocked, so B can send, so we can send if src is B
            State::Hold => {
                tracing::trace!(target: TRACING_TARGET,?src, ?dst, protocol = %message, "Hold");
                DeliveryStatus::Hold
            }
            _ => {
                tracing::trace!(target: TRACING_TARGET,?src, ?dst, protocol = %message, "Drop");
                return Ok(());
            }
        };

        let sent = Sent { src, dst, status, protocol: message, to };

        self.sent.push_back(sent);
        Ok(())
    }

    // Rig patch: upstream's `tick`, which set the link's copy of the time and
    // called this, is gone: the topology calls this with its time.
    fn process_deliverables(&mut self, now: Instant) {
        // Rig patch: nothing is on its way on most links on most steps.
        if self.sent.is_empty() {
            return;
        }
        // TODO: `drain_filter` is not yet stable, and so we have a low quality
        // implementation here that avoids clones.
        let mut deliverable = 0;
        for i in 0..self.sent.len() {
            let index = i - deliverable;
            let sent = &self.sent[index];
            if let DeliveryStatus::DeliverAfter(time) = sent.status {
                if time <= now {
                    let sent = self.sent.remove(index).unwrap();
                    let envelope = Envelope { src: sent.src, dst: sent.dst, message: sent.protocol };
                    self.ready[sent.to] += 1;
                    self.deliverable[sent.to].push_back(envelope);
                    deliverable += 1;
                }
            }
        }
    }

    // FIXME: This implementation does not respect message delivery order. If
    // host A and host B are ordered (by addr), and B sends before A, then this
    // method will deliver A's message before B's.
    // Rig patch: `host` is the link's end `end`; `now` is the network's time.
    fn deliver_messages(
        &mut self,
        global_config: &config::Link,
        rand: &mut dyn RngCore,
        host: &mut Host,
        end: usize,
        now: Instant,
    ) {
        // Rig patch: most links have nothing for most hosts on most steps; look
        // first. The queue is taken whole rather than drained into a new vector
        // (what is delivered meanwhile waits in a fresh queue, as before in the
        // drained one), and handed back, empty, to keep its room.
        if self.deliverable[end].is_empty() {
            return;
        }
        let mut deliverable = std::mem::take(&mut self.deliverable[end]);
        self.ready[end] -= deliverable.len();

        while let Some(message) = deliverable.pop_front() {
            let (src, dst) = (message.src, message.dst);
            if let Err(message) = host.receive_from_network(message) {
                // The reset goes back to the other end.
                let _ = self.enqueue_message(global_config, rand, dst, src, message, 1 - end, now);
            }
        }
        if self.deliverable[end].is_empty() {
            self.deliverable[end] = deliverable;
        }
    }

    // Randomly break or repair this link.
    fn rand_partition_or_repair(&mut self, global_config: &config::Link, rand: &mut dyn RngCore, now: Instant) {
        let do_rand = self.rand_partition(global_config.message_loss(), rand);
        match (self.state_a_b, self.state_b_a) {
            (State::Healthy, _) | (_, State::Healthy) if do_rand => {
                self.state_a_b = State::RandPartition;
                self.state_b_a = State::RandPartition;

                self.sent.clear();
            }
            (State::RandPartition, _) | (_, State::RandPartition)
                if self.rand_repair(global_config.message_loss(), rand) =>
            {
                self.release(now);
            }
            _ => {}
        }
    }

    fn hold(&mut self) {
        self.state_a_b = State::Hold;
        self.state_b_a = State::Hold;

        for sent in &mut self.sent {
            sent.status = DeliveryStatus::Hold;
        }
    }

    // This link becomes healthy, and any held messages are scheduled for delivery.
    fn release(&mut self, now: Instant) {
        self.state_a_b = State::Healthy;
        self.state_b_a = State::Healthy;
        for sent in &mut self.sent {
            if let DeliveryStatus::Hold = sent.status {
                sent.deliver(now);
            }
        }
    }

    fn explicit_partition(&mut self) {
        self.state_a_b = State::ExplicitPartition;
        self.state_b_a = State::ExplicitPartition;

        self.sent.clear();
    }

    fn partition_oneway(&mut self, from: IpAddr, to: IpAddr) {
        if from < to {
            self.state_a_b = State::ExplicitPartition;
        } else {
            self.state_b_a = State::ExplicitPartition;
        }

        self.sent.retain(|sent| sent.src.ip() != from);
    }

    fn repair_oneway(&mut self, from: IpAddr, to: IpAddr) {
        if from < to {
            self.state_a_b = State::Healthy;
        } else {
            self.state_b_a = State::Healthy;
        }
    }

    // Repair the link, without releasing any held messages.
    fn explicit_repair(&mut self) {
        self.state_a_b = State::Healthy;
        self.state_b_a = State::Healthy;
    }

    /// Should the link be randomly partitioned
    fn rand_partition(&self, global: &config::MessageLoss, rand: &mut dyn RngCore) -> bool {
        let config = self.config.message_loss.as_ref().unwrap_or(global);
        let fail_rate = config.fail_rate;
        fail_rate > 0.0 && rand.random_bool(fail_rate)
    }

    fn rand_repair(&self, global: &config::MessageLoss, rand: &mut dyn RngCore) -> bool {
        let config = self.config.message_loss.as_ref().unwrap_or(global);
        let repair_rate = config.repair_rate;
        repair_rate > 0.0 && rand.random_bool(repair_rate)
    }

    fn delay(&self, global: &config::Latency, rand: &mut dyn RngCore) -> Duration {
        let config = self.config.latency.as_ref().unwrap_or(global);

        let mult = config.latency_distribution.sample(rand);
        // Rig patch: the milliseconds as a `u64` when they fit (always, for a
        // latency): the same `f64` as from the `u128`, whose conversion is a
        // library call (once for every segment sent).
        let millis = (config.max_message_latency - config.min_message_latency).as_millis();
        let range = match u64::try_from(millis) {
            Ok(millis) => millis as f64,
            Err(_) => millis as f64,
        };
        let delay = config.min_message_latency + Duration::from_millis((range * mult) as _);

        std::cmp::min(delay, config.max_message_latency)
    }

    fn latency(&mut self, global: &config::Latency) -> &mut config::Latency {
        self.config.latency.get_or_insert_with(|| global.clone())
    }

    fn message_loss(&mut self, global: &config::MessageLoss) -> &mut config::MessageLoss {
        self.config.message_loss.get_or_insert_with(|| global.clone())
    }
}

#[cfg(test)]
mod tests {
    use crate::config::Link;

    use super::*;

    #[test]
    #[should_panic(expected = "unable to find link between Pair(10.0.0.1, 192.168.0.1)")]
    fn link_access_gives_useful_panic_message() {
        let mut topo = Topology::new(Link::default());
        topo.hold("10.0.0.1".parse().unwrap(), "192.168.0.1".parse().unwrap());
    }
}
