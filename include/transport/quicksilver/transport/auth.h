// Peer authentication: mutual challenge and response over a freshly connected or accepted
// TCP socket, with a cluster secret both sides know (docs/reliability.md; issue 15).
//
// It runs before the first byte of whatever protocol follows (the PS frames, the
// rendezvous lines, a collective library's store) and knows nothing of it: it reads exactly
// its own bytes, never one more, so the caller's protocol starts with the next byte.
//
// Protocol (version 1). Each side draws a 32-byte nonce (libsodium's randombytes_buf).
//   acceptor  -> connector   "QSA1" nonce_a                                    (36 bytes)
//   connector -> acceptor    "QSA1" nonce_c  proof_c                           (68 bytes)
//   acceptor  -> connector   proof_a                                           (32 bytes)
// proof_x = HMAC-SHA-256(key = secret, "quicksilver-auth-v1" 0 context 0 role_x nonce_c nonce_a)
// with role_x "connector" or "acceptor". The acceptor checks proof_c (constant-time) before
// it answers anything but its nonce, so a peer without the secret learns nothing but a
// random number; the connector checks proof_a, so a server or coordinator that is not the
// job's cannot pose as it. A recorded exchange is worthless later (the other side's nonce
// is fresh each time); a reflected one fails (the roles differ); `context` separates uses
// (the PS data path, the rendezvous, ...) so that a proof for one is refused by another.
// The secret never goes on the wire.
//
// What it does not do: encrypt, or protect the bytes that follow against a man in the
// middle who can rewrite a TCP stream (docs/reliability.md, threat model).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "quicksilver/core/status.h"
#include "quicksilver/core/units.h"

namespace qs::transport {

// A cluster's shared secret: opaque bytes, kMinBytes..kMaxBytes. Move-only; the bytes are
// wiped when it is destroyed. Share one between the options of several nodes with
// std::shared_ptr<const Secret>.
class Secret {
 public:
  static constexpr std::size_t kMinBytes = 16;
  static constexpr std::size_t kMaxBytes = 4096;

  // The whole content of `path`. Errors (kInvalidArgument, naming the file): unreadable,
  // not a regular file, fewer than kMinBytes or more than kMaxBytes bytes.
  static Result<Secret> from_file(const std::string& path);
  // The same bounds on `bytes` (kInvalidArgument).
  static Result<Secret> from_bytes(std::string_view bytes);
  // 32 random bytes.
  static Secret generate();
  // Writes the secret to a new file `path` (mode 0600, O_EXCL: never over an existing
  // file). Errors name the file.
  Status write_file(const std::string& path) const;

  Secret(Secret&& o) noexcept = default;
  Secret& operator=(Secret&& o) noexcept;
  Secret(const Secret&) = delete;
  Secret& operator=(const Secret&) = delete;
  ~Secret();

  std::size_t size() const { return bytes_.size(); }
  const unsigned char* data() const { return bytes_.data(); }

 private:
  explicit Secret(std::vector<unsigned char> bytes) : bytes_(std::move(bytes)) {}
  void wipe();
  std::vector<unsigned char> bytes_;
};

enum class AuthRole {
  kConnector,  // the side that called connect()
  kAcceptor,   // the side that accepted
};

// One side's handshake as a state machine over a socket, for event loops: call step()
// whenever the socket is readable or writable (or at once after creating it), until it
// says kDone. Works on blocking and non-blocking sockets alike (every call is MSG_DONTWAIT).
// The secret must outlive the Handshake. Not thread-safe; one per connection.
class Handshake {
 public:
  enum class Want { kRead, kWrite, kDone };
  // `context`: what the connection is for (both sides must give the same, e.g. "ps");
  // at most 255 bytes.
  Handshake(const Secret& secret, AuthRole role, std::string_view context);
  ~Handshake();
  Handshake(const Handshake&) = delete;
  Handshake& operator=(const Handshake&) = delete;

  // Sends and receives what it can on `fd` now. Returns what it waits for next (kDone:
  // the peer proved it knows the secret, and it has our proof). Errors, after which the
  // caller closes the socket: kProtocolError "authentication failed: ..." (a wrong proof or
  // not a Quicksilver peer: the caller should log it and tell the peer nothing),
  // kUnavailable (the peer closed or reset), kIoError (a system call failed).
  Result<Want> step(int fd);
  bool done() const { return stage_ == Stage::kDone; }

  // Bytes each side sends (tests; a cap on what a stranger can make us read).
  static constexpr std::size_t kNonceBytes = 32, kProofBytes = 32, kMagicBytes = 4;

 private:
  enum class Stage { kSendNonce, kReadNonce, kSendProof, kReadProof, kDone };
  void proof(AuthRole role, unsigned char out[kProofBytes]) const;
  Status check_peer(const unsigned char* magic_nonce_proof, bool has_magic);

  const Secret& secret_;
  AuthRole role_;
  std::string context_;
  unsigned char mine_[kNonceBytes];
  unsigned char theirs_[kNonceBytes];
  Stage stage_;
  std::vector<unsigned char> out_;  // the message being sent
  std::size_t sent_ = 0;
  std::vector<unsigned char> in_;  // the message being received (exactly its size)
  std::size_t got_ = 0;
};

// For a poll loop holding a pending Handshake per connection: steps `*auth` on `fd`; once
// done, resets it and asks for POLLIN (the protocol that follows), else sets `*events` to
// what the handshake waits for. Errors as Handshake::step (the caller closes `fd`).
Status step_for_poll(std::unique_ptr<Handshake>* auth, int fd, short* events);

// Runs a whole handshake on `fd` (blocking or not: it waits with poll), failing with
// kUnavailable "authentication timed out" once `timeout` has passed. Errors as
// Handshake::step; on error the caller closes `fd`. For clients and simple servers
// (rendezvous, a store); an event loop drives a Handshake itself instead.
Status authenticate(int fd, const Secret& secret, AuthRole role, std::string_view context,
                    TimeNs timeout);

}  // namespace qs::transport
