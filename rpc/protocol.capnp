@0xb15f067de254cf73;
# weft's RPC wire protocol: every message two weft workers exchange.
#
# This file is the specification. rpc/frame.h describes how one `Message` travels on a byte
# stream (a fixed preamble, the Cap'n Proto segments, then the raw bytes of each tensor);
# rpc/codec.h describes how C++ values map onto `Value`.
#
# ========================================================================================
# Vocabulary
#
# A *worker* is one process of a weft job, known by a unique name and a rank in [0, worldSize).
# A *connection* joins two workers over a reliable, ordered byte stream (TCP between two
# workers; a worker's connection to itself stays in memory), on which nothing below relies
# beyond order and reliability. Either side may have opened it; the opener is the *initiator*,
# the other the *acceptor*. Once the handshake is done the connection is symmetric: both sides send
# calls, responses, cancels and heartbeats on it. In the comments below "sender" and "receiver"
# are those of the message being documented.
#
# Messages on one connection are delivered in the order they were sent; nothing in this file is
# ordered across different connections.
#
# ========================================================================================
# Connection lifetime
#
#   initiator                         acceptor
#   ---------  Hello  ------------->
#              <------------ Welcome  (or Abort, then close)
#   ---------  Call / Response / Cancel / Ping / Pong / ShutdownJoin / ShutdownProceed  ---
#              <------ the same, in the other direction ------
#   ---------  Abort (optional, on an error or a non-graceful shutdown), then close
#
# Before the handshake completes, the only messages allowed are `hello` (initiator, first and
# once) and `welcome` or `abort` (acceptor, first and once). Anything else, a second Hello, or a
# Hello on the acceptor's side of the stream is a protocol error.
#
# A protocol error (bytes that do not parse, a message out of place, an id that is not in the
# receiver's tables where it must be, a value of the wrong kind) ends the connection: the
# receiver sends an `abort` describing it when it still can, closes the stream, fails every call
# pending on that connection with the error, and logs one line. It never crashes, and never
# hands malformed data to user code.
#
# ========================================================================================
# The tables, and the lifetime of every id
#
# Each side of a connection keeps, for that connection only:
#   - outgoing calls: calls it sent and has neither received the response for nor given up on
#     (timeout, cancellation), keyed by callId;
#   - incoming calls: calls it received and has not yet answered or dropped, keyed by callId.
# The sender's outgoing table mirrors the receiver's incoming table. The two directions use
# independent id spaces: callId 7 from A to B and callId 7 from B to A are different calls.
#
# callId: chosen by the caller, from a 64-bit counter that never repeats on this connection
#   (it is never reused, even after the call ends, so a late response or a late cancel can
#   always be recognised as stale and dropped). Zero is never used. Lives from the `call` that
#   introduces it until the caller has the `response` or has given up (then a late response is
#   dropped silently); on the callee from the `call` until its `response` is sent or a `cancel`
#   arrives.
#
# Heartbeat sequence numbers and shutdown rounds are described with their messages.
#
# Ids of remote references (RRefs) and of distributed autograd contexts outlive a connection:
# they are (creating worker, counter) pairs and are documented where they appear.
#
# ========================================================================================
# Evolution
#
# Cap'n Proto ordinals must be consecutive, so there are no gaps to reserve: a new message is the
# next ordinal of `Message`'s union, a new field the next ordinal of its struct, and old readers
# skip fields they do not know. A union member a receiver does not know (a message or value kind
# from a newer peer) is a protocol error at that receiver, never silently ignored. An
# incompatible change bumps the protocol version carried in the frame preamble and in `Hello`.
#
# The layers above rpc add no message kinds: remote references (rref/) and distributed
# autograd (dist_autograd/) travel as calls to reserved functions (weft.rref.*, weft.autograd.*),
# which reuse the call ids, timeouts, cancellation and failure handling of calls, and which
# the receiver runs on its loop thread in arrival order. What they add to this file is data
# inside calls and responses: `Value.rref` (RRefDesc), `callFlagHasRrefs`,
# `Response.hasRrefs` and `AutogradInfo`. A method of an owned object is addressed by the
# arguments of weft.rref.call. See "Remote references" and "Distributed autograd" at the end
# of this file.

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("weft::rpc::wire");

const protocolVersion :UInt16 = 1;
# The version this file describes. Carried in every frame preamble (rpc/frame.h) and in Hello /
# Welcome; a receiver rejects any other version before parsing anything else.

# ========================================================================================
# The envelope

struct Message {
  # The root of every frame. Exactly one member is set.
  union {
    hello @0 :Hello;
    welcome @1 :Welcome;
    abort @2 :ErrorStatus;
    # Sent by either side right before it closes the connection on purpose: a failed handshake
    # (wrong version, wrong token, name or rank conflict), a protocol error in what it received,
    # or a non-graceful shutdown (code `disconnected`). The receiver fails every call pending on
    # the connection with this status (origin: the sender), logs it once and closes its side.
    # Nothing may follow an abort on the stream.

    call @3 :Call;
    response @4 :Response;
    cancel @5 :Cancel;

    ping @6 :Heartbeat;
    pong @7 :Heartbeat;

    shutdownJoin @8 :ShutdownJoin;
    shutdownProceed @9 :ShutdownProceed;
  }
}

# ========================================================================================
# Handshake

struct Hello {
  # Sent by the initiator as the first message of the connection, exactly once, before anything
  # else. The acceptor answers with `welcome` when every check passes, otherwise with `abort`
  # (code `protocol` for a version mismatch, `invalidArgument` for a token, name, rank or world
  # size that does not fit) and closes.

  protocolVersion @0 :UInt16;
  # Must equal the acceptor's `protocolVersion`. (The preamble of this very frame already
  # carried it, so a mismatch is caught there first; the field keeps the handshake readable on
  # its own.)

  workerName @1 :Text;
  # The initiator's unique name, e.g. "trainer1". Non-empty. Lives as long as the worker's
  # process; a restarted process may reuse it (see `incarnation`).

  rank @2 :UInt32;
  # The initiator's rank, in [0, worldSize). weft's Agent connects each worker to every lower
  # rank, so its acceptor also requires this rank to be above its own and not yet connected.

  worldSize @3 :UInt32;
  # How many workers the initiator believes the job has; must equal the acceptor's.

  incarnation @4 :UInt64;
  # A random number the initiator chose when its agent started, the same on all its connections
  # and never reused. A peer that sees a known name with a new incarnation knows the worker
  # restarted, and fails whatever it still had pending with the old one.

  authToken @5 :Data;
  # The job's shared token (WEFT_RPC_TOKEN), or empty when none is configured. The acceptor
  # compares it with its own in constant time; a mismatch (including one side having none) is an
  # abort. The token guards against connections from other jobs or stray processes; it is not
  # encryption and travels in the clear.
}

struct Welcome {
  # The acceptor's answer to a valid Hello: the handshake is complete on both sides once the
  # initiator has read it. Sent exactly once, as the acceptor's first message. The initiator
  # checks the same things the acceptor did (version, world size, that the name and rank are the
  # ones it meant to reach) and sends `abort` then closes when they do not match.

  protocolVersion @0 :UInt16;
  workerName @1 :Text;
  rank @2 :UInt32;
  worldSize @3 :UInt32;
  incarnation @4 :UInt64;
  # The acceptor's own values, with the meanings given in Hello.
}

# ========================================================================================
# Calls

struct Call {
  # Sent by a caller to run a registered function on the receiver (the callee). The callee
  # answers with exactly one `response` carrying the same callId, unless the call is cancelled
  # first or `flags` has `noReply`.
  #
  # The callee looks the function up by functionId; an unknown id (or a known id whose name
  # differs, a hash collision) is answered with an error response of code `notFound`. Arguments
  # that do not decode as the declared parameter types (another kind of value, a value out of
  # range, a malformed pointer inside them) are answered with code `protocol`, naming the
  # function and the argument index. Neither ends the connection: the frame itself was sound.

  callId @0 :UInt64;
  # Chosen by the caller; see "The tables, and the lifetime of every id" above.

  functionId @1 :UInt64;
  # 64-bit FNV-1a of the UTF-8 bytes of the function's registered name (rpc::nameId in
  # rpc/frame.h). Fixed for the life of the program that declares the function.

  functionName @2 :Text;
  # The registered name, for error messages and to detect id collisions.

  args @3 :List(Value);
  # The arguments, in declaration order.

  timeoutMs @4 :UInt64;
  # The caller's timeout in milliseconds, 0 for none. The caller enforces it (and sends
  # `cancel` when it expires); the callee may use it to skip work nobody will wait for. Relative,
  # because the two workers' clocks are not comparable.

  flags @5 :UInt32;
  # A set of the `callFlag*` bits below. Bits not defined by this version must be zero; a
  # receiver treats any other bit as a protocol error rather than ignore a meaning it lacks.

  autograd @6 :AutogradInfo;
  # Null unless the call was made inside a distributed autograd context (see AutogradInfo and
  # "Distributed autograd" at the end of this file).
}

const callFlagNoReply :UInt32 = 1;
# The caller does not want a response (a notification). The callee runs the function and sends
# nothing back, not even an error; the callId still identifies the call for `cancel` and tracing.

const callFlagHasRrefs :UInt32 = 2;
# The arguments hold at least one `Value.rref`. The receiver then takes over every reference in
# the frame when it arrives, before the call is dispatched, even if it is never run (unknown
# function, cancelled): see "Remote references" below. A `Value.rref` in a frame without this
# flag is a protocol error.

struct Response {
  # Sent by the callee exactly once for each call it accepted without `noReply`, when the
  # function's result (or its returned future) is ready, or when it failed. After sending it the
  # callee forgets the callId. The caller completes the call's future with it and forgets the
  # callId; a response for a callId that is not in the caller's outgoing table (it timed out or
  # was cancelled) is dropped without a trace beyond a debug log line.

  callId @0 :UInt64;
  # The id of the call this answers.

  union {
    value @1 :Value;
    # The function's return value (`none` for a function returning void).

    error @2 :ErrorStatus;
    # Why the call failed: the handler threw (code `failed`), the function is unknown
    # (`notFound`), the arguments did not decode (`protocol`), or it was cancelled (`cancelled`).
    # `worker` and `function` name where it happened; the caller raises it as RemoteError or the
    # typed error of its code.
  }

  autograd @3 :AutogradInfo;
  # Null unless the call carried an AutogradInfo and the value holds tensors that require grad
  # (then messageId is never 0).

  hasRrefs @4 :Bool;
  # The value holds at least one `Value.rref`; as callFlagHasRrefs for a call. The caller takes
  # over the references even when it drops the response (the call timed out).
}

struct Cancel {
  # Sent by a caller that gave up on a call it sent (timeout, or the user cancelled its future)
  # and removed from its outgoing table. The callee drops the call if it has not started, and
  # drops the result if it is running; it sends no response in either case. A cancel for a
  # callId the callee does not know (already answered, or never seen) is ignored: it crossed the
  # response on the wire.

  callId @0 :UInt64;
  # The id of the call to abandon.
}

struct ErrorStatus {
  # A failure, as weft::Status carries it (common/status.h).

  code @0 :StatusCode;
  message @1 :Text;
  # What went wrong, for a human.
  worker @2 :Text;
  # The worker where it arose; empty when the sender itself is that worker and did not say.
  function @3 :Text;
  # The function being served when it arose; empty when none.
}

enum StatusCode {
  # Mirrors weft::StatusCode (common/status.h); the numbers are the same and never change.
  # `ok` never travels: a success is a value, not an ErrorStatus. A receiver rejects any number
  # it does not know as a protocol error.
  ok @0;
  failed @1;
  timeout @2;
  disconnected @3;
  notFound @4;
  invalidArgument @5;
  protocol @6;
  cancelled @7;
}

struct AutogradInfo {
  # Links a call or response to a distributed autograd context (dist_autograd/). The sender
  # records a send node for the message's tensors that require grad; the receiver records the
  # matching recv node under the same ids, so backward can travel the reverse path.

  contextId @0 :Int64;
  # The context: creating worker's id in the high 16 bits, that worker's counter below. Lives
  # until the context is released on every worker that saw it (weft.autograd.release).

  messageId @1 :Int64;
  # Identifies this send/recv pair inside the context, chosen by the sender from its own
  # counter, same layout as contextId; 0 when the message carries no tensor that requires grad
  # (no pair: the context id travels so that the callee runs inside the context). Lives as
  # long as the context.

  gradTensors @2 :UInt32;
  # How many tensors of the message require grad: the inputs of the sender's send node, numbered
  # by TensorDesc.gradSlot. 0 when messageId is 0.
}

# ========================================================================================
# Values
#
# Arguments and return values. A Value is self-describing enough to be checked against the
# type the receiver declared: the receiver never guesses, it compares the union member with the
# one its C++ type maps to (rpc/codec.h) and reports the difference.

struct Value {
  union {
    none @0 :Void;
    # An empty std::optional, an undefined Tensor, or the result of a void function.

    boolean @1 :Bool;
    int @2 :Int64;
    # Any signed integral C++ type; the receiver checks the value fits its declared type.
    uint @3 :UInt64;
    # Any unsigned integral C++ type (except bool); range-checked likewise.
    float32 @4 :Float32;
    float64 @5 :Float64;

    text @6 :Text;
    # std::string: any bytes, UTF-8 by convention. Cap'n Proto adds the NUL terminator.
    bytes @7 :Data;
    # std::vector<uint8_t> / std::vector<std::byte>.

    tensor @8 :TensorDesc;
    # A tensor; its bytes travel out of band (see TensorDesc).

    list @9 :List(Value);
    # std::vector<T> for non-arithmetic T; every element has T's kind.
    tuple @10 :List(Value);
    # std::tuple / std::pair: exactly as many elements as the tuple has, each of its own type.
    map @11 :List(MapEntry);
    # std::map / std::unordered_map; keys are unique (a duplicate is a protocol error).
    record @12 :Record;
    # A user struct declared with WEFT_CODEC_FIELDS.

    intList @13 :List(Int64);
    uintList @14 :List(UInt64);
    float32List @15 :List(Float32);
    float64List @16 :List(Float64);
    boolList @17 :List(Bool);
    # std::vector of an arithmetic type, packed: 1 to 8 bytes per element instead of a Value each.

    rref @18 :RRefDesc;
    # A remote reference (weft::RRef<T>, rref/rref.h); see "Remote references" below.
  }
}

struct MapEntry {
  key @0 :Value;
  value @1 :Value;
}

struct Record {
  typeName @0 :Text;
  # The struct's C++ name as written in WEFT_CODEC_FIELDS; the receiver checks it equals the
  # name of the type it declared.
  fields @1 :List(Value);
  # The fields in declaration order; their number must equal the declared one.
}

enum DType {
  # Mirrors weft::DType (common/dtype.h); the numbers are the same and never change.
  float32 @0;
  float64 @1;
  int64 @2;
  bfloat16 @3;
  float16 @4;
  int32 @5;
  uint8 @6;
  boolean @7;  # one byte per element, 0 or 1
}

struct TensorDesc {
  # A tensor's metadata. Its elements are the out-of-band buffer `buffer` of the frame carrying
  # this message (rpc/frame.h): row-major contiguous bytes, no strides. A sender sends a
  # non-contiguous view as a contiguous copy. Several descriptors may name the same buffer (the
  # same tensor passed twice); the receiver then builds tensors that share one storage.
  #
  # The receiver checks, before building a tensor: dtype is known, at most 16 dimensions, every
  # size >= 0, the element count times the element size does not overflow and equals
  # byteLength, `buffer` is an index of this frame and that buffer is exactly byteLength long.

  dtype @0 :DType;
  shape @1 :List(Int64);
  byteLength @2 :UInt64;
  buffer @3 :UInt32;
  # Index into the frame's out-of-band buffers. Meaningful only within this frame.
  requiresGrad @4 :Bool;
  # The sender's tensor required grad (floating dtypes only). In a message without an
  # AutogradInfo whose messageId is set, the receiver's tensor is a leaf that requires grad;
  # otherwise its grad function is the receiver's recv node, slot `gradSlot`.

  gradSlot @5 :UInt32;
  # With requiresGrad inside a message whose AutogradInfo has a messageId: which input of the
  # sender's send node this tensor is (< AutogradInfo.gradTensors). Several descriptors may share
  # a slot only if they describe the same occurrence decoded twice.
}

# ========================================================================================
# Failure detection

struct Heartbeat {
  # `ping` is sent by either side after the connection has been silent (nothing received) for
  # the heartbeat interval; the receiver answers at once with a `pong` carrying the same
  # sequence. Any message received, not only a pong, proves the peer alive. A side that has seen
  # nothing from its peer for the configured number of intervals declares it dead: it fails every
  # call pending on the connection with `disconnected` and closes.

  sequence @0 :UInt64;
  # Chosen by the pinger from a counter per connection; echoed by the pong. Lives until the
  # matching pong arrives or the next ping supersedes it.
}

# ========================================================================================
# Graceful shutdown
#
# A barrier led by one worker (the leader, rank 0), so that no worker closes while the job runs or
# while another still has calls in flight that involve it. Each round:
#   1. every worker that entered shutdown sends `shutdownJoin` to the leader (the leader
#      joins locally), saying whether it is idle: no outgoing call pending and no incoming call
#      being served;
#   2. the leader answers with `shutdownProceed` to each of them.
# Round 1 is the job's end: the leader waits, with no deadline, for a join from every worker,
# then sends `shutdownProceed` with done = false; until then each worker keeps working as before.
# Rounds 2, 3, ... drain: when the leader holds a join of the current round from every worker
# still alive (or the shutdown timeout, counted from the end of round 1, expired), it sends
# `shutdownProceed`: `done` when all were idle, and then everyone closes; otherwise each worker
# waits until it is idle (or a short pause passes) and joins the next round.
# A worker whose connection drops in round 1 fails the barrier: every worker that learns of it
# (the leader, or any other, by its own failure detection) sends `shutdownProceed` with round 0 to
# every other worker still connected, naming the workers it lost, and closes; a worker receiving
# it does the same when it is in round 1 (at once) or when it later enters shutdown. In the drain,
# a worker whose connection drops is recorded as missing, not waited for.

struct ShutdownJoin {
  # Sent by a worker to the leader once per round, after it entered shutdown (round 1) or after
  # a `shutdownProceed` with done = false (the next round).

  round @0 :UInt32;
  # Starts at 1, one more each round. Lives for one round.
  idle @1 :Bool;
  # True when the sender has no outgoing call pending and is serving no incoming call.
}

struct ShutdownProceed {
  # Sent by the leader to every worker that joined, ending a round; or, with round 0, by any
  # worker leaving a failed barrier, to every other worker still connected.

  round @0 :UInt32;
  # The round it ends; 0: the sender leaves because the workers in `missing` are gone.
  done @1 :Bool;
  # True: everyone was idle (or the leader's timeout expired); close every connection after
  # the calls still being answered have been answered. False: join round + 1. Always true in
  # round 0, never in round 1.
  missing @2 :List(Text);
  # The names of workers the sender did not hear from (dead or timed out), so each worker can
  # report them from shutdown().
}

# ========================================================================================
# Remote references
#
# A remote reference (RRef, rref/rref.h) names a value or object that lives on one worker, its
# *owner*, from any worker of the job. The owner keeps the value while some handle to it exists
# anywhere; every worker other than the owner that holds handles holds one or more *forks*, and
# the owner keeps the set of forks it knows of. The protocol is PyTorch's owner/user protocol
# (ids of forks, fork request, child accept, user delete) carried by calls to reserved functions
# (names starting with "weft.rref."), which the receiver runs on its loop thread in the order they
# arrive on the connection (rpc::Registry::implOnLoop). That ordering is what the guarantees
# below rest on.
#
# Ids. An RRef id and a fork id have the same layout: the rank of the worker that made it in the
# high 16 bits, a counter of that worker in the low 48, never reused while the job runs. An RRef
# id lives until the owner deletes the value (its last fork deleted and no handle left on the
# owner); a fork id lives from the moment it is created until its holder's `delete` reaches the
# owner, or until the holder's or the owner's connection fails.
#
# Who sends what (arguments are the tuple in args[0]; `args` of the target go in args[1]):
#   weft.rref.create (rrefId, forkId, kind, name, index)  creator -> owner: remote(). Registers the
#       creator's fork (forkId = rrefId; 0 when the creator is the owner) and starts building the
#       value: kind 0 constructs the remote class `name` with its constructor `index`, kind 1 runs
#       the registered function `name`, kind 2 runs method `name` of the object rrefId `index`.
#       args[1] are the constructor's or function's arguments. Answered (none) at once: the
#       answer is the owner's confirmation of the fork. A failure while building is kept and
#       returned by every later use of the reference.
#   weft.rref.call (rrefId, method)  any holder -> owner: runs the method on the object when it
#       exists (a call arriving before the create is queued), answers the method's result.
#   weft.rref.fetch (rrefId)  any holder -> owner: answers a copy of the value (toHere()).
#   weft.rref.fork (rrefId, forkId)  new holder -> owner: the receiver of a reference sent by a
#       user that is not the owner asks the owner to register its fork; answered at once. Then
#       the new holder's fork is confirmed and it sends weft.rref.accept to the sender.
#   weft.rref.accept (forkId)  new holder -> sender (the parent): the child fork is registered;
#       the parent may now drop the handle it kept alive for it (guarantee G2).
#   weft.rref.delete (rrefId, forkId)  holder -> owner: the holder dropped its last handle of
#       that fork (guarantee G1: sent only after the fork was confirmed, so it never overtakes
#       the fork's registration).
#
# Sending a reference to worker D inside any call or response (a Value.rref):
#   - D is the owner: no fork is made; forkId is 0. D holds the value on arrival.
#   - the sender is the owner: it registers a new fork for D before sending; D's fork is
#     confirmed on arrival.
#   - otherwise (a user sends to a third worker or to itself): the sender makes a new fork id,
#     keeps its own handle alive for it (a pending child), and D asks the owner to register it
#     (weft.rref.fork) when the frame arrives, then accepts it at the sender (weft.rref.accept).
# A frame that is never sent undoes its forks. A receiver takes over every reference in a
# frame when it arrives, whether or not the frame is used (a dropped response, a cancelled
# call), and drops the ones nothing decoded, which then are deleted as above.
#
# Failures. When a worker's connection fails, its peers forget it: an owner drops every fork
# that worker held, and fails the references it had not finished creating; a holder fails every
# handle whose owner it was (DisconnectedError) and drops the children it kept for it.
# Graceful shutdown first deletes every fork a worker holds, and the shutdown barrier waits
# until no fork request, accept or delete is outstanding.

struct RRefDesc {
  # A remote reference inside a Value. Sent as described above.

  rrefId @0 :UInt64;
  # The reference (see Ids). Never 0.
  forkId @1 :UInt64;
  # The fork made for the receiver, 0 when the receiver is the owner.
  owner @2 :UInt32;
  # The owner's rank.
  parent @3 :UInt32;
  # The sender's rank (the worker the receiver accepts the fork at).
  typeName @4 :Text;
  # The value's type (a remote class's name, or the codec's type name, rpc/codec.h); the
  # receiver checks it against the RRef<T> it decodes.
}

# ========================================================================================
# Distributed autograd
#
# A distributed autograd context (dist_autograd/dist_autograd.h) links the backward graphs that
# calls made inside it build on several workers. Its messages are calls to reserved functions
# (names starting with "weft.autograd."), run on the receiver's loop thread as they arrive
# (rpc::Registry::implOnLoop); the work they start runs on the handler pool.
#
# Recording. A call made inside a context carries an AutogradInfo with the context id. If its
# arguments hold tensors that require grad, the sender records a send node (inputs: those tensors,
# numbered by TensorDesc.gradSlot) under a fresh messageId, and the receiver gives the decoded
# tensors a recv node that remembers (sender, contextId, messageId). The receiver creates the
# context on first sight and runs the function inside it; a response holding tensors that
# require grad is recorded the same way from the callee to the caller (Response.autograd). Each
# side remembers the other as a worker the context reached.
#
# Ids. contextId: see AutogradInfo. A backward pass id has the same layout (the initiating
# worker's rank high, its counter below) and lives for one pass: a worker receiving a request of
# a pass it has not seen starts a new pass of the context, counting dependencies from every send
# node the context holds there (FAST mode).
#
# Who sends what (arguments are one tuple in args[0]):
#   weft.autograd.backward (contextId, passId, messageId, retainGraph, grads)  recv side -> send
#       side: the gradients of the tensors of message messageId (a List of tensors indexed by
#       gradSlot; `none` for a slot that got no gradient). The receiver adds them to the send
#       node, runs what becomes ready and answers (none) when that work and every backward
#       request it sent meanwhile have been answered; a failure anywhere is the error of the
#       answer, with the origin of where it arose. An unknown context or message is `notFound`.
#   weft.autograd.release (contextIds)  any worker -> a worker the contexts reached: drop these
#       contexts. The receiver drops each one it still holds and forwards the release to the
#       workers that context reached (except the sender); it answers (none) when those forwards
#       are answered. Unknown ids are ignored (already released). A message of a released context
#       arriving later is run outside any context.
#
# Failures. When a worker's connection fails, its peers drop every context it reached (a user
# holding one gets DisconnectedError on use), and the backward requests pending on it fail.
