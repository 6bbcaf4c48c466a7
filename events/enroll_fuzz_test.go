package events

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/nats-io/nkeys"
)

// FuzzDecodeEnrollRequest: an enrollment request is the first thing an
// unenrolled party sends; whatever the bytes, decoding never panics, and
// what decodes has a user key and a token shaped like a JWT and encodes
// back to an equal request.
func FuzzDecodeEnrollRequest(f *testing.F) {
	kp, _ := nkeys.CreateUser()
	pub, _ := kp.PublicKey()
	good, _ := json.Marshal(EnrollRequest{Token: "a.b.c", Key: pub})
	f.Add(good)
	f.Add([]byte(`{"token":"a.b.c","key":"` + pub + `","extra":1}`))
	f.Add([]byte(`{"token":"a.b.c","key":"` + pub + `"}{}`))
	f.Add([]byte(`{"token":"","key":""}`))
	f.Add([]byte(`[]`))
	f.Add([]byte(strings.Repeat("{", 1000)))
	f.Fuzz(func(t *testing.T, data []byte) {
		req, err := DecodeEnrollRequest(data)
		if err != nil {
			if err.Error() == "" {
				t.Fatal("an error without a message")
			}
			return
		}
		if !nkeys.IsValidPublicUserKey(req.Key) || strings.Count(req.Token, ".") != 2 {
			t.Fatalf("decoded an invalid request %+v", req)
		}
		b, err := json.Marshal(req)
		if err != nil {
			t.Fatal(err)
		}
		again, err := DecodeEnrollRequest(b)
		if err != nil || again != req {
			t.Fatalf("round trip: %+v, %v", again, err)
		}
	})
}

// TestDecodeEnrollRequestRefuses names what is wrong with bad requests.
func TestDecodeEnrollRequestRefuses(t *testing.T) {
	kp, _ := nkeys.CreateUser()
	pub, _ := kp.PublicKey()
	seed, _ := kp.Seed()
	tests := []struct {
		name, data, want string
	}{
		{"not json", `nope`, "invalid character"},
		{"unknown field", `{"token":"a.b.c","key":"` + pub + `","admin":true}`, "unknown field"},
		{"trailing", `{"token":"a.b.c","key":"` + pub + `"} {}`, "trailing data"},
		{"seed as key", `{"token":"a.b.c","key":"` + string(seed) + `"}`, "not an nkey user public key"},
		{"no token", `{"key":"` + pub + `"}`, "not a JWT"},
		{"too large", `{"token":"` + strings.Repeat("a", 20<<10) + `"}`, "more than"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := DecodeEnrollRequest([]byte(tt.data))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got %v, want %q", err, tt.want)
			}
		})
	}
}
