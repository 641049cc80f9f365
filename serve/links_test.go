package serve

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tensorwire/tensorwire/rpc"
	"github.com/tensorwire/tensorwire/tensordict"
)

// deadFolder makes a client's folder at dir as a client makes it, its lock
// free, with a file of the user's beside the slots.
func deadFolder(t *testing.T, dir string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, schema := range map[string]tensordict.RowSchema{"in": testIn, "out": testOut} {
		td, err := schema.Create(filepath.Join(dir, name), 4)
		if err != nil {
			t.Fatal(err)
		}
		td.Close()
	}
	if err := os.WriteFile(filepath.Join(dir, "keep.txt"), []byte("mine"), 0o644); err != nil {
		t.Fatal(err)
	}
}

func checkKept(t *testing.T, dir string) {
	t.Helper()
	if b, err := os.ReadFile(filepath.Join(dir, "keep.txt")); err != nil || string(b) != "mine" {
		t.Errorf("%s/keep.txt, outside the folder served: %q, %v; want it untouched", dir, b, err)
	}
	if _, err := os.Lstat(filepath.Join(dir, "lock")); err == nil {
		t.Errorf("a lock file was made in %s, outside the folder served", dir)
	}
}

// TestRemote_SweepFollowsNoLink: the node removes the folder of a client
// whose lease ran out and whose lock is free; when the clients' folder
// has been replaced by a link to elsewhere meanwhile, the folder there is
// left (it was locked and removed through the link).
func TestRemote_SweepFollowsNoLink(t *testing.T) {
	root := t.TempDir()
	cfg := testConfig(&behaviour{}, 4)
	cfg.Lease = 200 * time.Millisecond
	n := serveModel(t, root, cfg)
	clients := filepath.Join(root, filepath.FromSlash(ClientsDir))
	deadFolder(t, filepath.Join(clients, "00000000000000aa"))
	rc, err := rpc.Dial(ctxT(t), n.addr, rpc.WithRoot(root))
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	r, err := rpc.Call[registerResponse](ctxT(t), rc, MethodRegister,
		registerRequest{Name: "model", Prefix: ClientsDir + "/00000000000000aa", Slots: 4})
	if err != nil {
		t.Fatal(err)
	}
	outside := filepath.Join(t.TempDir(), "clients")
	if err := os.Rename(clients, outside); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, clients); err != nil {
		t.Fatal(err)
	}
	time.Sleep(4 * cfg.Lease) // the lease runs out, and the sweep comes
	_, err = rpc.Call[predictResponse](ctxT(t), rc, MethodPredict, predictRequest{Name: "model", Client: r.Client, N: 1})
	if !errors.Is(err, ErrNotRegistered) {
		t.Fatalf("predict after the lease ran out: %v, want ErrNotRegistered", err)
	}
	checkKept(t, filepath.Join(outside, "00000000000000aa"))
}

// TestRemote_RegisterFollowsNoLink: the node maps a client's slots and
// ring read-write from its folder; a folder that is a link to another
// folder under the root, or slots linked to another client's, are refused
// naming what is wrong, never mapped.
func TestRemote_RegisterFollowsNoLink(t *testing.T) {
	root := t.TempDir()
	n := serveModel(t, root, testConfig(&behaviour{}, 4))
	clients := filepath.Join(root, filepath.FromSlash(ClientsDir))
	other := filepath.Join(root, "other") // under the root, not a client's
	deadFolder(t, other)
	folderLink := filepath.Join(clients, "00000000000000bb")
	os.MkdirAll(clients, 0o755)
	if err := os.Symlink(other, folderLink); err != nil {
		t.Fatal(err)
	}
	// A client whose input slots are another's.
	cc := filepath.Join(clients, "00000000000000cc")
	deadFolder(t, cc)
	os.RemoveAll(filepath.Join(cc, "in"))
	if err := os.Symlink("../../../other/in", filepath.Join(cc, "in")); err != nil {
		t.Fatal(err)
	}
	rc, err := rpc.Dial(ctxT(t), n.addr, rpc.WithRoot(root))
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	for _, tc := range []struct{ hex, want string }{
		{"00000000000000bb", folderLink},
		{"00000000000000cc", "in"},
	} {
		_, err := rpc.Call[registerResponse](ctxT(t), rc, MethodRegister,
			registerRequest{Name: "model", Prefix: ClientsDir + "/" + tc.hex, Slots: 4})
		if !errors.Is(err, ErrSchema) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("register of %s: %v, want ErrSchema naming %s", tc.hex, err, tc.want)
		}
	}
}

// TestDial_RemovesNoFolderThroughALink: a client removes the folders of
// dead clients and bells it finds under the root; where the clients' or
// the bells' folder is a link to elsewhere, nothing there is removed, and
// neither a client's slots nor a node's bell are made through a link:
// Dial fails naming it (the node's bell: requests come by call).
func TestDial_RemovesNoFolderThroughALink(t *testing.T) {
	for _, dir := range []string{ClientsDir, BellsDir} {
		t.Run(filepath.Base(dir), func(t *testing.T) {
			root := t.TempDir()
			n := serveModel(t, root, testConfig(&behaviour{}, 4))
			outside := filepath.Join(t.TempDir(), "elsewhere")
			deadFolder(t, filepath.Join(outside, "00000000000000dd"))
			link := filepath.Join(root, filepath.FromSlash(dir))
			os.MkdirAll(filepath.Dir(link), 0o755)
			if err := os.Symlink(outside, link); err != nil {
				t.Fatal(err)
			}
			c, err := Dial(ctxT(t), n.addr, "model", WithRoot(root))
			if err == nil {
				c.Close()
			}
			if dir == ClientsDir && (err == nil || !strings.Contains(err.Error(), link)) {
				t.Errorf("Dial with %s a link: %v, want an error naming it", dir, err)
			}
			checkKept(t, filepath.Join(outside, "00000000000000dd"))
			if entries, _ := os.ReadDir(outside); len(entries) != 1 {
				t.Errorf("%d entries made where %s points, want none but the dead folder", len(entries)-1, link)
			}
		})
	}
}
