// Prints where golang/groupcache's consistenthash puts each key: one case per line of cases.txt
// ("REPLICAS<TAB>node,node,..."), each followed by every key of keys.hex (hex, one per line).
// Output: "case REPLICAS<TAB>NODES", then "hex(key)<TAB>node" lines.
package main

import (
	"bufio"
	"encoding/hex"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/golang/groupcache/consistenthash"
)

func main() {
	keysFile, _ := os.Open(os.Args[2])
	var keys [][]byte
	sc := bufio.NewScanner(keysFile)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		k, err := hex.DecodeString(sc.Text())
		if err != nil {
			panic(err)
		}
		keys = append(keys, k)
	}
	cases, _ := os.Open(os.Args[1])
	cs := bufio.NewScanner(cases)
	out := bufio.NewWriter(os.Stdout)
	defer out.Flush()
	for cs.Scan() {
		parts := strings.SplitN(cs.Text(), "\t", 2)
		replicas, _ := strconv.Atoi(parts[0])
		m := consistenthash.New(replicas, nil)
		m.Add(strings.Split(parts[1], ",")...)
		fmt.Fprintf(out, "case %s\t%s\n", parts[0], parts[1])
		for _, k := range keys {
			fmt.Fprintf(out, "%s\t%s\n", hex.EncodeToString(k), m.Get(string(k)))
		}
	}
}
