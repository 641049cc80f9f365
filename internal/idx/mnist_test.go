package idx

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"io/fs"
	"path/filepath"
	"slices"
	"testing"

	"github.com/tensorwire/tensorwire/memmap"
)

// fashionMNIST is where the Debian package dataset-fashion-mnist installs the
// dataset. CI installs it; elsewhere the tests that need it skip.
const fashionMNIST = "/usr/share/datasets/fashion-mnist"

// openFashion opens one of the Fashion-MNIST files, skipping the test if the
// dataset is not installed.
func openFashion(t *testing.T, name string) *ReadCloser {
	t.Helper()
	r, err := Open(filepath.Join(fashionMNIST, name))
	if errors.Is(err, fs.ErrNotExist) {
		t.Skipf("Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist): %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

func TestReader_FashionMNIST(t *testing.T) {
	// Known values computed independently with Python's gzip and hashlib.
	tests := []struct {
		file   string
		shape  []int
		sha256 string // of the data section
	}{
		{"t10k-images-idx3-ubyte.gz", []int{10000, 28, 28}, "c867c93ff95360594e8ec3287995350b824dd110b11595c0e13d5423f621867a"},
		{"t10k-labels-idx1-ubyte.gz", []int{10000}, "3d0e6c6ea990b53b6f8f500a41cac93881d981b315f84578b7d915342ade01e9"},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			r := openFashion(t, tt.file)
			h := r.Header()
			if h.DType != memmap.Uint8 || !slices.Equal(h.Shape, tt.shape) {
				t.Fatalf("Header() = %v %v, want torch.uint8 %v", h.DType, h.Shape, tt.shape)
			}
			sum := sha256.New()
			n, err := io.Copy(sum, r)
			if err != nil {
				t.Fatal(err)
			}
			if n != h.NumBytes() {
				t.Errorf("read %d bytes, want NumBytes() = %d", n, h.NumBytes())
			}
			if got := hex.EncodeToString(sum.Sum(nil)); got != tt.sha256 {
				t.Errorf("sha256 of data = %s, want %s", got, tt.sha256)
			}
		})
	}
}

func TestReader_FashionMNISTLabels(t *testing.T) {
	r := openFashion(t, "t10k-labels-idx1-ubyte.gz")
	labels, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	if want := []byte{9, 2, 1, 1, 6, 1, 4, 6, 5, 7}; !slices.Equal(labels[:10], want) {
		t.Errorf("first labels = %v, want %v", labels[:10], want)
	}
	var count [10]int
	for i, l := range labels {
		if l > 9 {
			t.Fatalf("label %d is %d, want 0 to 9", i, l)
		}
		count[l]++
	}
	for class, n := range count {
		if n != 1000 {
			t.Errorf("class %d has %d test images, want 1000", class, n)
		}
	}
}
