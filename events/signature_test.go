package events

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
)

func userKey(t testing.TB) (nkeys.KeyPair, string) {
	t.Helper()
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := kp.PublicKey()
	return kp, pub
}

// TestVerify: a signed message verifies with its producer's key only, and
// only on the subject and payload that were signed.
func TestVerify(t *testing.T) {
	a, pubA := userKey(t)
	_, pubB := userKey(t)
	subj := "atoll.health.probe.u1.a"
	msg, err := NewMsg(subj, &atollv1.ProbeReport{Checker: "a", Unit: "u1", Sequence: 1}, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := SignMsg(msg, a); err != nil {
		t.Fatal(err)
	}
	flipped := bytes.Clone(msg.Data)
	flipped[len(flipped)-1] ^= 1
	account, _ := nkeys.CreateAccount()
	accountPub, _ := account.PublicKey()
	sig := msg.Header.Get(HeaderSignature)
	tests := []struct {
		name    string
		subject string
		header  nats.Header
		data    []byte
		pub     string
		want    error
	}{
		{"valid", subj, msg.Header, msg.Data, pubA, nil},
		{"another node's key", subj, msg.Header, msg.Data, pubB, ErrBadSignature},
		{"no key known", subj, msg.Header, msg.Data, "", ErrNoKey},
		{"not a user key", subj, msg.Header, msg.Data, accountPub, ErrNoKey},
		{"garbage key", subj, msg.Header, msg.Data, "Uxyz", ErrNoKey},
		{"unsigned", subj, nats.Header{}, msg.Data, pubA, ErrUnsigned},
		{"nil header", subj, nil, msg.Data, pubA, ErrUnsigned},
		{"payload changed", subj, msg.Header, flipped, pubA, ErrBadSignature},
		{"replayed on another subject", "atoll.health.probe.u2.a", msg.Header, msg.Data, pubA, ErrBadSignature},
		{"not base64", subj, nats.Header{HeaderSignature: {"!!!"}}, msg.Data, pubA, ErrBadSignature},
		{"truncated", subj, nats.Header{HeaderSignature: {sig[:40]}}, msg.Data, pubA, ErrBadSignature},
		{"oversized header", subj, nats.Header{HeaderSignature: {strings.Repeat("A", 4096)}}, msg.Data, pubA, ErrBadSignature},
		{"other encoding of the same bytes", subj, nats.Header{HeaderSignature: {sameBytes(t, sig)}}, msg.Data, pubA, ErrBadSignature},
		{"padded base64", subj, nats.Header{HeaderSignature: {sig + "=="}}, msg.Data, pubA, ErrBadSignature},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := Verify(tt.subject, tt.header, tt.data, tt.pub)
			if !errors.Is(err, tt.want) || (tt.want == nil) != (err == nil) {
				t.Fatalf("Verify = %v, want %v", err, tt.want)
			}
		})
	}
}

// TestVerifyCloud: what the cloud signs with an account key verifies
// against that account key only, never against a user key (nor a user
// key's signature against the account).
func TestVerifyCloud(t *testing.T) {
	account, _ := nkeys.CreateAccount()
	accountPub, _ := account.PublicKey()
	other, _ := nkeys.CreateAccount()
	otherPub, _ := other.PublicKey()
	user, userPub := userKey(t)
	subj := "atoll.view._all.services.default.web"
	signed := func(s Signer) *nats.Msg {
		m := nats.NewMsg(subj)
		m.Data = []byte("view")
		if err := SignMsg(m, s); err != nil {
			t.Fatal(err)
		}
		return m
	}
	byAccount, byUser := signed(account), signed(user)
	for _, tt := range []struct {
		name string
		msg  *nats.Msg
		pub  string
		want error
	}{
		{"valid", byAccount, accountPub, nil},
		{"another account", byAccount, otherPub, ErrBadSignature},
		{"a user key given", byAccount, userPub, ErrNoKey},
		{"signed by a user", byUser, accountPub, ErrBadSignature},
		{"no key", byAccount, "", ErrNoKey},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := VerifyCloud(tt.msg.Subject, tt.msg.Header, tt.msg.Data, tt.pub)
			if !errors.Is(err, tt.want) || (tt.want == nil) != (err == nil) {
				t.Fatalf("VerifyCloud = %v, want %v", err, tt.want)
			}
		})
	}
	if err := Verify(byAccount.Subject, byAccount.Header, byAccount.Data, accountPub); !errors.Is(err, ErrNoKey) {
		t.Errorf("Verify took an account key: %v", err)
	}
}

// sameBytes returns another base64url text of sig's bytes: its last
// character's unused low bit set, which a lenient decoder ignores.
func sameBytes(t *testing.T, sig string) string {
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	i := strings.IndexByte(alphabet, sig[len(sig)-1])
	other := sig[:len(sig)-1] + string(alphabet[i^1])
	a, _ := base64.RawURLEncoding.DecodeString(sig)
	b, err := base64.RawURLEncoding.DecodeString(other)
	if err != nil || !bytes.Equal(a, b) {
		t.Fatalf("%q and %q do not decode to the same bytes leniently", sig, other)
	}
	return other
}

// TestSigningInputSeparatesFields: moving bytes between the subject and
// the payload changes what is signed.
func TestSigningInputSeparatesFields(t *testing.T) {
	if bytes.Equal(SigningInput("a.b", []byte("c")), SigningInput("a", []byte(".bc"))) {
		t.Fatal("signing inputs of different (subject, payload) pairs are equal")
	}
	if !bytes.HasPrefix(SigningInput("s", nil), []byte(signatureContext+"\x00")) {
		t.Fatal("signing input does not start with the context")
	}
}

// FuzzVerify: arbitrary subjects, headers, payloads and keys never panic,
// and nothing verifies but the exact (subject, payload) that was signed
// with the given key.
func FuzzVerify(f *testing.F) {
	kp, pub := userKey(f)
	signed := func(subject string, payload []byte) string {
		sig, _ := kp.Sign(SigningInput(subject, payload))
		return base64.RawURLEncoding.EncodeToString(sig)
	}
	b, _ := NewMsg("atoll.health.probe.u1.a", &atollv1.ProbeReport{Checker: "a", Unit: "u1"}, "")
	f.Add("atoll.health.probe.u1.a", b.Data, signed("atoll.health.probe.u1.a", b.Data), pub, true)
	f.Add("atoll.health.probe.u1.a", b.Data, "", pub, false)
	f.Add("x", []byte{0}, "AAAA", "U", false)
	f.Fuzz(func(t *testing.T, subject string, payload []byte, header, key string, sign bool) {
		if sign {
			header = signed(subject, payload)
		}
		h := nats.Header{}
		if header != "" {
			h.Set(HeaderSignature, header)
		}
		err := Verify(subject, h, payload, key)
		if err == nil {
			if key != pub {
				t.Fatalf("verified with key %q, signed by %q", key, pub)
			}
			if header != signed(subject, payload) {
				// ed25519 signatures are deterministic: any other header
				// that verifies would be a forgery.
				t.Fatalf("verified a header that is not the signature")
			}
			return
		}
		if !errors.Is(err, ErrNoKey) && !errors.Is(err, ErrUnsigned) && !errors.Is(err, ErrBadSignature) {
			t.Fatalf("unexpected error kind: %v", err)
		}
		if sign && key == pub {
			t.Fatalf("a genuine signature does not verify: %v", err)
		}
	})
}

// BenchmarkSignVerify: what signing costs a prober and verifying costs a
// voter, per probe report of a unit of 128 members.
func BenchmarkSignVerify(b *testing.B) {
	kp, pub := userKey(b)
	r := &atollv1.ProbeReport{Checker: "a", Unit: "u1"}
	for i := range 128 {
		r.Peers = append(r.Peers, &atollv1.PeerResult{Node: fmt.Sprintf("node-%03d", i), Normal: true, Score: 100, Scoreline: 100})
	}
	msg, err := NewMsg("atoll.health.probe.u1.a", r, "")
	if err != nil {
		b.Fatal(err)
	}
	b.Run("sign", func(b *testing.B) {
		for b.Loop() {
			if err := SignMsg(msg, kp); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("verify", func(b *testing.B) {
		for b.Loop() {
			if err := Verify(msg.Subject, msg.Header, msg.Data, pub); err != nil {
				b.Fatal(err)
			}
		}
	})
}
